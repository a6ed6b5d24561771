"""Mask reading and downsampling vs the reference (torch bilinear, align_corners=False)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from masc_engine.runtime.masks import DEFAULT_FG_THRESHOLD, mask_to_patch_grid, normalize_mask
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
            t = DEFAULT_FG_THRESHOLD
            flips += int(((ref > t) != (ours > t)).sum() + ((ref >= t) != (ours >= t)).sum())
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


def _png(arr: np.ndarray) -> bytes:
    import io

    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "PNG")
    return buf.getvalue()


def test_16_bit_masks_read_as_their_8_bit_equivalents():
    """A 16-bit 0/1 label mask covers what its 1s cover, as an 8-bit 0/1 mask does; other 16-bit
    masks are scaled to 8 bits (65535 -> 255, 32768 -> 128), never clipped to white."""
    from masc_engine.runtime.io import mask_from_bytes

    labels = np.zeros((8, 8), np.uint16)
    labels[2:6, 1:7] = 1
    as_8bit = normalize_mask(mask_from_bytes(_png(labels.astype(np.uint8))))
    assert as_8bit.sum() == 24
    np.testing.assert_array_equal(normalize_mask(mask_from_bytes(_png(labels))), as_8bit)
    np.testing.assert_array_equal(normalize_mask(mask_from_bytes(_png(labels * 65535))), as_8bit)
    soft = mask_from_bytes(_png(np.array([[0, 32768, 65535]], np.uint16)))
    np.testing.assert_array_equal(soft, [[0, 128, 255]])


# ---------------------------------------------------------------------- the size rule (MaskPolicy)


def test_mask_policy_order_and_messages():
    from masc_engine.errors import InputError
    from masc_engine.runtime.masks import MaskPolicy

    refuse = MaskPolicy()
    assert refuse.check((480, 640), (480, 640), "reference") is None
    with pytest.raises(InputError) as e:
        refuse.check((480, 640), (480, 640, 3), "reference")
    assert (e.value.reason, e.value.detail) == (
        "bad_mask",
        "reference mask must be 2-D (H, W), got shape (480, 640, 3)",
    )
    with pytest.raises(InputError) as e:  # the scorer API's words (no file name, no option to suggest)
        refuse.check((6, 5), (4, 3), "output")
    assert (e.value.reason, e.value.detail) == ("mask_size_mismatch", "output mask is 3x4 (WxH) but its image is 5x6")
    with pytest.raises(InputError) as e:
        refuse.check((480, 640), (640, 480), "reference", "m.png", exif="apply")
    assert e.value.reason == "mask_orientation_mismatch"
    assert e.value.detail == (
        "reference mask m.png is 480x640, its image 640x480: they fit only rotated by 90 "
        "degrees (EXIF orientation applied to one of them? --exif is apply)"
    )
    # Tolerance: up to N pixels off in each dimension, inclusive; the orientation check comes first.
    two = MaskPolicy(size_tolerance=2)
    assert two.check((100, 200), (102, 198), "output") == "output mask 198x102 stretched to its image 200x100"
    with pytest.raises(InputError, match="mask_size_mismatch|is 197x100") as e:
        two.check((100, 200), (100, 197), "output", "o.png", remedy="--flag N")
    assert e.value.detail == "output mask o.png is 197x100 (WxH) but its image is 200x100 (--flag N)"
    with pytest.raises(InputError) as e:
        two.check((100, 101), (101, 100), "output")
    assert e.value.reason == "mask_orientation_mismatch"
    # Stretch: any size, as the reference does.
    stretch = MaskPolicy.named("stretch")
    assert stretch == MaskPolicy(stretch=True) and MaskPolicy.named("refuse") == refuse
    assert stretch.check((480, 640), (640, 480), "reference") == "reference mask 480x640 stretched to its image 640x480"
    assert stretch.check((480, 640), (10, 10), "reference") is not None


def test_mask_policy_settings_are_checked():
    from masc_engine.runtime.masks import MASK_SIZE_POLICIES, MaskPolicy

    assert MASK_SIZE_POLICIES == ("refuse", "stretch")
    with pytest.raises(ValueError, match="mask_size_policy"):
        MaskPolicy.named("crop")
    with pytest.raises(ValueError, match=">= 0"):
        MaskPolicy(size_tolerance=-1)
    with pytest.raises(TypeError):
        MaskPolicy(size_tolerance=1.5)
    with pytest.raises(TypeError):
        MaskPolicy(stretch="yes")


def test_every_front_end_uses_the_one_policy(naflex_bundle):
    """The scorer API (ScorerConfig.mask_size_policy), masc-run / masc-serve (RunSettings'
    mask_size_tolerance, jobs/items.py) and masc-rank (query masks) refuse by the same rule."""
    from PIL import Image

    from masc_engine.errors import InputError
    from masc_engine.jobs.items import DecodedImage, DecodedMask, check_mask
    from masc_engine.runtime.masks import MaskPolicy
    from masc_engine.runtime.scorer import Scorer

    s = Scorer(naflex_bundle)
    assert s.mask_policy == MaskPolicy()
    assert Scorer(naflex_bundle, mask_size_policy="stretch").mask_policy == MaskPolicy(stretch=True)
    im = Image.new("RGB", (64, 48))
    with pytest.raises(InputError) as e:  # a rotated mask: the API now says so too
        s.score(im, np.zeros((64, 48), np.uint8), im, np.zeros((48, 64), np.uint8), "a photo", None)
    assert e.value.reason == "mask_orientation_mismatch"
    image = DecodedImage("0" * 64, (64, 48), (3, 4))
    assert check_mask(image, DecodedMask((63, 49), 0.0, False), "output", "o.png", 1, "apply") is not None
    with pytest.raises(InputError) as e:
        check_mask(image, DecodedMask((62, 48), 0.0, False), "output", "o.png", 1, "apply")
    assert e.value.detail.endswith("(--mask-size-tolerance N stretches masks up to N pixels off)")
