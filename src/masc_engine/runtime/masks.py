"""Foreground masks, read and downsampled to the patch grid as the reference does.

Ported from masc-metric 0.3.0 ``masc/metric.py`` ``MaSC._downsample_mask``:

- values are uint8 0..255 or float 0..1; an array whose maximum exceeds ``1 + 1e-6`` is divided
  by 255 (so a uint8 mask holding only 0/1 is read as 0..1, as the reference reads it);
- bilinear resize to ``(Hp, Wp)`` with ``align_corners=False`` and *no* antialiasing
  (``torch.nn.functional.interpolate`` defaults), then clamp to ``[0, 1]``.

The interpolation below follows ATen's CPU ``upsample_bilinear2d`` kernel (source index
``scale * (dst + 0.5) - 0.5`` as a fused multiply-add, clamped at 0, ``scale = in / out`` in
float32, width first then height) in float32. Measured against torch 2.13 on the shared DreamBooth
masks and random masks: max difference 1.8e-7 (one or two float32 ulps), so patch weights sit on
the same side of the 0.5 threshold as the reference's (tests/test_masks.py counts flips).
"""

from __future__ import annotations

import numpy as np

#: Threshold on the downsampled mask (masc-metric 0.3.0 ``DEFAULT_FG_THRESHOLD``): CP keeps
#: reference patches with weight ``> 0.5``; PF hides output patches with weight ``>= 0.5``.
DEFAULT_FG_THRESHOLD = 0.5


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
    if arr.max() > 1.0 + 1e-6:
        arr = arr / np.float32(255.0)
    return arr


def mask_coverage(mask: np.ndarray) -> float:
    """Share of a mask's pixels that are foreground under the scoring rule, in ``[0, 1]``.

    The one mask rule: the mask is read as scoring reads it (:func:`normalize_mask`: uint8
    0..255, or any array whose maximum is at most 1 as 0..1, so a 0/1 PNG covers what its 1s
    cover), and a pixel is foreground at ``>= 0.5``, so JPEG noise does not count. Used by the
    paper's coverage filter, the report and the summary (masc-run's ``*_mask_coverage`` columns).

    Args:
        mask: ``[H, W]`` uint8, bool or float mask (the loader's output: palette and 16-bit masks
            are already 0/255 or 8-bit).

    Raises:
        ValueError: the mask is not 2-D, or is empty.
    """
    arr = normalize_mask(mask)
    return float(np.count_nonzero(arr >= np.float32(0.5))) / float(arr.size)


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
    return np.clip(out, 0.0, 1.0).astype(np.float32).reshape(-1)

