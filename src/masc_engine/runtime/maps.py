"""Attribution maps: where a pair's CP and PF come from, as PNG overlays.

- CP map (over the reference image): each reference patch's best cosine to any output patch
  (the per-patch maxima that ``masked_maxcos`` averages); patches outside the reference
  foreground (weight <= threshold) are left unpainted, since CP ignores them. Fixed colour scale
  ``[0, 1]`` so maps of different pairs are comparable.
- PF map (over the output image): the pooling head's attention over the output's patches with the
  foreground hidden (averaged over heads), scaled to its maximum: which background regions the
  pooled embedding that PF compares with the prompt is made of.

Colours: a viridis-like ramp (5 anchors of matplotlib's viridis, linearly interpolated), so the
runtime needs no plotting library.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from .masks import cp_keep

# matplotlib's viridis at 0, 0.25, 0.5, 0.75, 1.
_ANCHORS = np.array([[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]], np.float64)


def _lut() -> np.ndarray:
    x = np.linspace(0, 1, 256)
    pos = np.linspace(0, 1, len(_ANCHORS))
    return np.stack([np.interp(x, pos, _ANCHORS[:, c]) for c in range(3)], axis=1).astype(np.uint8)


LUT = _lut()


def overlay(
    image: Image.Image,
    grid: tuple[int, int],
    values: np.ndarray,
    paint: np.ndarray,
    vmin: float = 0.0,
    vmax: float = 1.0,
    alpha: float = 0.6,
) -> Image.Image:
    """Blend per-patch ``values [Hp*Wp]`` (colour-mapped on ``[vmin, vmax]``) over ``image``
    where ``paint [Hp*Wp] bool``; other patches are shown darkened. Returns an RGB image of the
    image's size."""
    hp, wp = grid
    v = np.clip((np.asarray(values, np.float64) - vmin) / max(vmax - vmin, 1e-12), 0, 1)
    rgb = LUT[np.round(v * 255).astype(np.int64)].reshape(hp, wp, 3)
    a = np.where(np.asarray(paint).reshape(hp, wp), alpha, 0.0)
    colour = np.asarray(Image.fromarray(rgb, "RGB").resize(image.size, Image.Resampling.NEAREST), np.float64)
    weight = (
        np.asarray(
            Image.fromarray((a * 255).astype(np.uint8), "L").resize(image.size, Image.Resampling.NEAREST), np.float64
        )[..., None]
        / 255.0
    )
    base = np.asarray(image.convert("RGB"), np.float64)
    dim = np.where(weight > 0, 1.0, 0.45)  # darken what the score ignores
    out = base * dim * (1 - weight) + colour * weight
    return Image.fromarray(np.clip(out, 0, 255).astype(np.uint8), "RGB")


def cp_map(
    ref_image: Image.Image, grid: tuple[int, int], best: np.ndarray, ref_weights: np.ndarray, threshold: float
) -> Image.Image:
    """The CP overlay: best cosine per reference patch, on the reference foreground."""
    return overlay(ref_image, grid, best, cp_keep(ref_weights, threshold), 0.0, 1.0)


def pf_map(out_image: Image.Image, grid: tuple[int, int], attention: np.ndarray, hidden: np.ndarray) -> Image.Image:
    """The PF overlay: the pooling head's background attention over the output."""
    att = np.asarray(attention, np.float64)
    top = att.max() if att.size and att.max() > 0 else 1.0
    return overlay(out_image, grid, att / top, ~np.asarray(hidden, bool), 0.0, 1.0)
