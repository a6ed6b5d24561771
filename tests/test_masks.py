"""Mask reading and downsampling vs the reference (torch bilinear, align_corners=False)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from masc_engine.runtime.masks import mask_to_patch_grid, normalize_mask
from masc_engine.tolerances import MASK_GRID_ATOL

GRIDS = [(16, 16), (14, 18), (18, 14), (12, 21), (24, 42), (4, 60), (60, 4), (7, 7), (32, 32), (23, 44)]


def _reference(mask: np.ndarray, grid) -> np.ndarray:
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    arr = np.asarray(mask).astype(np.float32)
    if arr.max() > 1.0 + 1e-6:
        arr = arr / 255.0
    t = F.interpolate(torch.from_numpy(arr)[None, None], size=grid, mode="bilinear", align_corners=False)
    return t[0, 0].clamp(0.0, 1.0).flatten().numpy()


def test_real_masks_match_torch_without_threshold_flips(photo_dir):
    worst, flips = 0.0, 0
    paths = sorted(photo_dir.glob("masks/*/*.png"))
    assert len(paths) >= 22, photo_dir
    for path in paths:
        m = np.array(Image.open(path).convert("L"))
        for g in GRIDS:
            ref, ours = _reference(m, g), mask_to_patch_grid(m, g)
            worst = max(worst, float(np.abs(ref - ours).max()))
            flips += int(((ref > 0.5) != (ours > 0.5)).sum() + ((ref >= 0.5) != (ours >= 0.5)).sum())
    assert worst <= MASK_GRID_ATOL
    assert flips == 0


def test_random_masks_match_torch():
    rng = np.random.default_rng(1)
    for i in range(200):
        h, w = (int(x) for x in rng.integers(1, 300, 2))
        g = tuple(int(x) for x in rng.integers(1, 48, 2))
        m = rng.random((h, w)).astype(np.float32) if i % 2 else (rng.random((h, w)) > 0.5).astype(np.uint8) * 255
        assert np.abs(_reference(m, g) - mask_to_patch_grid(m, g)).max() <= MASK_GRID_ATOL


def test_value_conventions_follow_the_reference():
    # uint8 0..255 is divided by 255; a 0/1 uint8 mask or a float mask is read as 0..1 already.
    np.testing.assert_array_equal(normalize_mask(np.array([[0, 255]], np.uint8)), [[0.0, 1.0]])
    np.testing.assert_array_equal(normalize_mask(np.array([[0, 1]], np.uint8)), [[0.0, 1.0]])
    np.testing.assert_array_equal(normalize_mask(np.array([[0.0, 0.25]], np.float32)), [[0.0, 0.25]])
    full = mask_to_patch_grid(np.full((64, 64), 255, np.uint8), (4, 4))
    assert full.shape == (16,) and np.all(full == 1.0)
    with pytest.raises(ValueError):
        normalize_mask(np.zeros((2, 2, 3)))
