"""The mask policy: value conventions, the foreground threshold, the size check, and the
downsampling of a mask to the patch grid as the reference does. Every mask rule of masc-engine
lives here; the scorer API, masc-run, masc-serve and masc-rank call it.

Ported from masc-metric 0.3.0 ``masc/metric.py`` (``MaSC._downsample_mask``,
``MaSC._concept_preservation``, ``MaSC._prompt_following``):

- values (:func:`normalize_mask`): uint8 0..255 or float 0..1; an array whose maximum exceeds
  ``1 + 1e-6`` (:data:`UINT8_SCALE_ABOVE`) is divided by 255, so a uint8 mask holding only 0/1 is
  read as 0..1, as the reference reads it;
- the threshold (:data:`DEFAULT_FG_THRESHOLD`) on the patch grid: CP keeps reference patches with
  weight ``> threshold`` (:func:`cp_keep`); PF hides output patches with weight ``>= threshold``
  (:func:`foreground`), the rule a pixel's coverage is measured by too (:func:`mask_coverage`);
- bilinear resize to ``(Hp, Wp)`` with ``align_corners=False`` and *no* antialiasing
  (``torch.nn.functional.interpolate`` defaults), then clamp to ``[0, 1]``.

The size check (:class:`MaskPolicy`) is ours: the reference silently stretches a mask of another
size onto the patch grid, so a mask for another image (or another orientation) scores the wrong
region; we refuse it unless the caller asks for stretching.

The interpolation below follows ATen's CPU ``upsample_bilinear2d`` kernel (source index
``scale * (dst + 0.5) - 0.5`` as a fused multiply-add, clamped at 0, ``scale = in / out`` in
float32, width first then height) in float32. Measured against torch 2.13 on the shared DreamBooth
masks and random masks: max difference 1.8e-7 (one or two float32 ulps), so patch weights sit on
the same side of the 0.5 threshold as the reference's (tests/test_masks.py counts flips).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InputError

#: Threshold on the downsampled mask (masc-metric 0.3.0 ``DEFAULT_FG_THRESHOLD``): CP keeps
#: reference patches with weight ``> 0.5``; PF hides output patches with weight ``>= 0.5``.
DEFAULT_FG_THRESHOLD = 0.5

#: A mask whose maximum exceeds this is read as uint8 0..255 and divided by 255; at or below it,
#: as 0..1 (masc-metric 0.3.0 ``_downsample_mask``: ``if m.max() > 1.0 + 1e-6``).
UINT8_SCALE_ABOVE = 1.0 + 1e-6

#: ``ScorerConfig.mask_size_policy`` values, each a :class:`MaskPolicy` (:meth:`MaskPolicy.named`).
MASK_SIZE_POLICIES = ("refuse", "stretch")


def normalize_mask(mask: np.ndarray) -> np.ndarray:
    """``[H, W]`` mask (uint8 0..255, bool, or float 0..1) -> ``[H, W] float32`` in ``[0, 1]``.

    Raises:
        ValueError: the mask is not 2-D, or is empty.
    """
    arr = np.asarray(mask)
    if arr.ndim != 2:
        raise ValueError(f"mask must be 2-D, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError("mask is empty")
    arr = arr.astype(np.float32)
    if arr.max() > UINT8_SCALE_ABOVE:
        arr = arr / np.float32(255.0)
    return arr


def _weights(w: Any) -> Any:
    """An array as given (numpy, or a device array of another array module), lists as numpy."""
    return w if hasattr(w, "dtype") else np.asarray(w)


def cp_keep(ref_weights: Any, threshold: float = DEFAULT_FG_THRESHOLD) -> Any:
    """The reference patches CP averages over: weight ``> threshold`` (strictly).

    Args:
        ref_weights: ``[N] float32`` reference mask on the patch grid, in ``[0, 1]`` (numpy, or
            an array of another array module such as CuPy).
        threshold: the foreground threshold (:data:`DEFAULT_FG_THRESHOLD`).

    Returns:
        ``[N] bool``, of the same array module.
    """
    return _weights(ref_weights) > np.float32(threshold)


def foreground(weights: Any, threshold: float = DEFAULT_FG_THRESHOLD) -> Any:
    """Foreground at ``>= threshold``: the output patches PF's pooling hides, and the pixels a
    mask's coverage counts.

    Args:
        weights: mask values in ``[0, 1]`` (patch weights, or a normalised mask), any shape.
        threshold: the foreground threshold (:data:`DEFAULT_FG_THRESHOLD`).

    Returns:
        ``bool`` of the same shape and array module.
    """
    return _weights(weights) >= np.float32(threshold)


def mask_coverage(mask: np.ndarray) -> float:
    """Share of a mask's pixels that are foreground under the scoring rule, in ``[0, 1]``.

    The mask is read as scoring reads it (:func:`normalize_mask`: uint8 0..255, or any array
    whose maximum is at most 1 as 0..1, so a 0/1 PNG covers what its 1s cover), and a pixel is
    foreground at ``>= 0.5`` (:func:`foreground`), so JPEG noise does not count. Used by the
    paper's coverage filter, the report and the summary (masc-run's ``*_mask_coverage`` columns).

    Args:
        mask: ``[H, W]`` uint8, bool or float mask (the loader's output: palette and 16-bit masks
            are already 0/255 or 8-bit).

    Raises:
        ValueError: the mask is not 2-D, or is empty.
    """
    arr = normalize_mask(mask)
    return float(np.count_nonzero(foreground(arr))) / float(arr.size)


@dataclass(frozen=True)
class MaskPolicy:
    """What happens to a mask whose ``(H, W)`` differs from its image's: the one size rule of the
    scorer API, masc-run, masc-serve and masc-rank.

    In order: a mask that is not 2-D is refused (``bad_mask``); the same size passes; with
    ``stretch`` any size passes (the reference's behaviour); a mask that fits only rotated by 90
    degrees is refused (``mask_orientation_mismatch``: an EXIF orientation applied to one file
    and not the other); a mask at most ``size_tolerance`` pixels off in each dimension passes with
    a note; anything else is refused (``mask_size_mismatch``). A mask that passes is stretched
    onto the patch grid with the image (:func:`mask_to_patch_grid` needs no particular size).

    ``ScorerConfig.mask_size_policy`` maps onto it by :meth:`named` (``"refuse"``: the default
    policy; ``"stretch"``: ``stretch=True``); masc-run's and masc-serve's
    ``--mask-size-tolerance N`` (``RunSettings.mask_size_tolerance``) is ``size_tolerance=N``.

    Attributes:
        size_tolerance: pixels a mask may be off its image's width and height and still be
            stretched (with a note), ``>= 0``; 0 refuses any difference.
        stretch: stretch a mask of any size, as masc-metric 0.3.0 does without a word.
    """

    size_tolerance: int = 0
    stretch: bool = False

    def __post_init__(self) -> None:
        t = self.size_tolerance
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)):
            raise TypeError(f"size_tolerance must be an int, got {type(t).__name__}")
        if t < 0:
            raise ValueError(f"size_tolerance must be >= 0, got {t}")
        if not isinstance(self.stretch, bool):
            raise TypeError(f"stretch must be a bool, got {type(self.stretch).__name__}")

    @classmethod
    def named(cls, mask_size_policy: str) -> "MaskPolicy":
        """The policy a ``ScorerConfig.mask_size_policy`` name stands for (``refuse``, ``stretch``).

        Raises:
            ValueError: another name.
        """
        if mask_size_policy not in MASK_SIZE_POLICIES:
            raise ValueError(f"mask_size_policy must be one of {MASK_SIZE_POLICIES}, got {mask_size_policy!r}")
        return cls(stretch=mask_size_policy == "stretch")

    def check(
        self,
        image_hw: tuple[int, int],
        mask_shape: tuple[int, ...],
        what: str,
        name: str = "",
        *,
        exif: str | None = None,
        remedy: str = "",
    ) -> str | None:
        """Whether a mask of shape ``mask_shape`` may be scored with an image of ``image_hw``.

        Args:
            image_hw: the image's ``(height, width)`` in pixels (after EXIF orientation).
            mask_shape: the mask's shape, ``(height, width)`` for a usable mask.
            what: ``"reference"``, ``"output"`` or ``"query"``: which mask, in messages.
            name: the mask's file or request field, in messages (``""``: none).
            exif: the EXIF policy the files were read under, named in an orientation refusal.
            remedy: how the caller's command widens the policy, appended to a size refusal
                (masc-run: ``--mask-size-tolerance N ...``).

        Returns:
            ``None`` for a mask of its image's size, else the note for ``status_detail`` (the
            mask was stretched).

        Raises:
            InputError: ``bad_mask`` (not 2-D), ``mask_orientation_mismatch`` or
                ``mask_size_mismatch``.
        """
        label = f"{what} mask {name}" if name else f"{what} mask"
        if len(mask_shape) != 2:
            raise InputError("bad_mask", f"{label} must be 2-D (H, W), got shape {tuple(mask_shape)}")
        (h, w), (ih, iw) = (int(x) for x in mask_shape), (int(x) for x in image_hw)
        if (h, w) == (ih, iw):
            return None
        note = f"{what} mask {w}x{h} stretched to its image {iw}x{ih}"
        if self.stretch:
            return note
        if (h, w) == (iw, ih):
            raise InputError(
                "mask_orientation_mismatch",
                f"{label} is {w}x{h}, its image {iw}x{ih}: they fit only rotated by 90 degrees "
                f"(EXIF orientation applied to one of them?{f' --exif is {exif}' if exif else ''})",
            )
        if abs(h - ih) <= self.size_tolerance and abs(w - iw) <= self.size_tolerance:
            return note
        raise InputError(
            "mask_size_mismatch",
            f"{label} is {w}x{h} (WxH) but its image is {iw}x{ih}" + (f" ({remedy})" if remedy else ""),
        )


def _linear_indices(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """ATen ``compute_indices_weights_linear`` for ``align_corners=False``: index0, index1,
    lambda0, lambda1 (float32)."""
    scale = np.float32(in_size) / np.float32(out_size)
    # ATen's vectorised kernel evaluates scale * (dst + 0.5) - 0.5 as one fused multiply-add:
    # the float64 product of a float32 and a half-integer is exact, so a single rounding to
    # float32 here reproduces the FMA (a plain float32 multiply then subtract is off by up to 1.5e-5
    # at 512 -> 7 and flips patches across the 0.5 threshold).
    real = (np.float64(scale) * (np.arange(out_size, dtype=np.float64) + 0.5) - 0.5).astype(np.float32)
    real = np.maximum(real, np.float32(0.0))
    i0 = np.minimum(np.floor(real).astype(np.int64), in_size - 1)
    lam1 = np.clip(real - i0.astype(np.float32), 0.0, 1.0).astype(np.float32)
    lam0 = (np.float32(1.0) - lam1).astype(np.float32)
    i1 = np.minimum(i0 + 1, in_size - 1)
    return i0, i1, lam0, lam1


def mask_to_patch_grid(mask: np.ndarray, spatial_shape: tuple[int, int]) -> np.ndarray:
    """Downsample a mask to the patch grid.

    Args:
        mask: ``[H, W]`` uint8 0..255 or float 0..1; foreground = non-zero.
        spatial_shape: the patch grid ``(Hp, Wp)``.

    Returns:
        ``[Hp * Wp] float32`` patch weights in ``[0, 1]``, row-major over the grid.
    """
    arr = normalize_mask(mask)
    hp, wp = spatial_shape
    h, w = arr.shape
    yi0, yi1, yl0, yl1 = _linear_indices(h, hp)
    xi0, xi1, xl0, xl1 = _linear_indices(w, wp)
    rows0 = arr[yi0]  # [Hp, W]
    rows1 = arr[yi1]
    # Inner (width) interpolation first, then height, as ATen's Interpolate<2> evaluates it.
    t0 = rows0[:, xi0] * xl0 + rows0[:, xi1] * xl1
    t1 = rows1[:, xi0] * xl0 + rows1[:, xi1] * xl1
    out = t0 * yl0[:, None] + t1 * yl1[:, None]
    weights: np.ndarray = np.clip(out, 0.0, 1.0).astype(np.float32).reshape(-1)
    return weights
