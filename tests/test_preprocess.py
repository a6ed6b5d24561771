"""Torch-free preprocessing vs transformers' PIL-backed image processors (the reference's, when
torchvision is absent), and the position-embedding resize vs transformers' own."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from support import EXAMPLES, checkpoint_dir, grid_image
from masc_engine.runtime.position import position_weights
from masc_engine.runtime.preprocess import ImageSettings, naflex_target_size, preprocess_image, rescale_normalise
from masc_engine.tolerances import PIXEL_VALUES_ATOL, POSITION_ATOL

# (grid, budget, image size in pixels): square, portrait, landscape and extreme grids, padding slots, tiny images.
GRID_CASES = [
    ((16, 16), 256, (256, 256)),
    ((14, 18), 252, (224, 288)),
    ((18, 14), 252, (288, 224)),
    ((12, 21), 252, (192, 336)),
    ((24, 42), 1024, (384, 672)),  # 1008 patches + 16 padding slots
    ((4, 60), 256, (64, 960)),  # 240 + 16 padding
    ((60, 4), 256, (960, 64)),
    ((7, 7), 49, (20, 20)),  # a tiny image, upscaled
]


def _settings(bundle, budget=None) -> ImageSettings:
    s = ImageSettings.from_manifest(json.loads((bundle / "manifest.json").read_text())["image"])
    return s.with_budget(budget) if budget else s


@pytest.fixture(scope="module")
def hf_processor(naflex_bundle):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoProcessor.from_pretrained(checkpoint_dir(naflex_bundle)).image_processor


@pytest.mark.parametrize("grid,budget,size", GRID_CASES, ids=[f"{g[0]}x{g[1]}" for g, _, _ in GRID_CASES])
def test_naflex_pixels_equal_reference(naflex_bundle, hf_processor, grid, budget, size):
    from masc_engine.export.validate import synthetic_image

    im = synthetic_image(size[0], size[1], seed=sum(size))
    ours = preprocess_image(im, _settings(naflex_bundle, budget))
    ref = hf_processor(images=[im], max_num_patches=budget, return_tensors="np")
    assert tuple(ref["spatial_shapes"][0]) == grid == ours.spatial_shape
    assert ours.pixel_values.shape == ref["pixel_values"][0].shape == (budget, 768)
    assert np.abs(ours.pixel_values - ref["pixel_values"][0]).max() <= PIXEL_VALUES_ATOL
    np.testing.assert_array_equal(ours.pixel_attention_mask, ref["pixel_attention_mask"][0])
    assert ours.pixel_attention_mask.sum() == grid[0] * grid[1]


def test_naflex_pixels_on_real_photos(naflex_bundle, hf_processor, photo_dir):
    s = _settings(naflex_bundle)
    worst = 0.0
    # every shipped photo; on the larger shared set, each subject's reference photo
    paths = sorted(photo_dir.glob("images/*/*.jpg" if photo_dir == EXAMPLES else "images/*/00.jpg"))
    assert len(paths) >= 22, photo_dir
    for path in paths:
        im = Image.open(path)
        ours = preprocess_image(im, s)
        ref = hf_processor(images=[im.convert("RGB")], max_num_patches=s.max_num_patches, return_tensors="np")
        assert tuple(ref["spatial_shapes"][0]) == ours.spatial_shape
        worst = max(worst, float(np.abs(ours.pixel_values - ref["pixel_values"][0]).max()))
    assert worst <= PIXEL_VALUES_ATOL


def test_fixed_pixels_equal_reference(fixed_bundle):
    transformers = pytest.importorskip("transformers")
    from masc_engine.export.validate import synthetic_image

    proc = transformers.AutoProcessor.from_pretrained(checkpoint_dir(fixed_bundle)).image_processor
    s = _settings(fixed_bundle)
    for h, w in [(128, 128), (480, 160), (9, 300), (512, 384)]:
        im = synthetic_image(h, w, seed=h + w)
        ours = preprocess_image(im, s)
        ref = proc(images=[im], return_tensors="np")["pixel_values"][0]
        assert ours.pixel_values.shape == ref.shape == (3, 128, 128)
        assert np.abs(ours.pixel_values - ref).max() <= PIXEL_VALUES_ATOL
        assert ours.spatial_shape == (8, 8)


def test_rgba_and_greyscale_are_converted_like_the_reference(naflex_bundle, hf_processor):
    s = _settings(naflex_bundle, 64)
    base = grid_image((8, 8))
    for im in (base.convert("RGBA"), base.convert("L"), base.convert("P")):
        ours = preprocess_image(im, s)
        ref = hf_processor(images=[im.convert("RGB")], max_num_patches=64, return_tensors="np")
        assert np.abs(ours.pixel_values - ref["pixel_values"][0]).max() <= PIXEL_VALUES_ATOL


@pytest.mark.parametrize(
    "rescale, mean, std",
    [
        (1 / 255, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),  # SigLIP2
        (1 / 255, (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)),  # CLIP
        (0.00392156862745098, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),  # ImageNet (DINO)
    ],
)
def test_rescale_normalise_is_the_reference_arithmetic_bit_for_bit(rescale, mean, std):
    """Every byte value in every channel, and a random image, against transformers' element-wise
    rule (float64 rescale cast to float32, then float32 normalize): equal bits, not closeness."""
    every = np.stack([np.arange(256, dtype=np.uint8)] * 3, axis=-1)[None]  # [1, 256, 3]
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, size=(37, 53, 3), dtype=np.uint8)
    for pixels in (every, image):
        x = (pixels.astype(np.float64) * rescale).astype(np.float32)
        want = np.ascontiguousarray(((x - np.float32(mean)) / np.float32(std)).transpose(2, 0, 1))
        got = rescale_normalise(pixels, rescale, mean, std)
        assert got.dtype == np.float32 and got.flags.c_contiguous and got.shape == want.shape
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    with pytest.raises(ValueError, match="uint8"):
        rescale_normalise(image.astype(np.float32), rescale, mean, std)


def test_naflex_target_size_matches_transformers():
    tf = pytest.importorskip("transformers.models.siglip2.image_processing_pil_siglip2")
    rng = np.random.default_rng(0)
    for _ in range(300):
        h, w = (int(x) for x in rng.integers(1, 3000, 2))
        budget = int(rng.choice([16, 49, 256, 576, 1024, 4096]))
        assert naflex_target_size(h, w, 16, budget) == tf.get_image_size_for_max_num_patches(h, w, 16, budget)


@pytest.mark.parametrize("grid", [g for g, _, _ in GRID_CASES] + [(1, 1), (1, 64), (3, 5), (32, 32)])
def test_position_weights_equal_transformers_resize(grid):
    m = pytest.importorskip("transformers.models.siglip2.modeling_siglip2")
    torch = pytest.importorskip("torch")
    table = torch.randn(16, 16, 24, generator=torch.Generator().manual_seed(0))
    n = max(1024, grid[0] * grid[1])
    ref = m.Siglip2VisionEmbeddings.resize_positional_embeddings(table, torch.tensor([grid]), n)[0].numpy()
    ours = position_weights(16, grid, n) @ table.reshape(256, 24).numpy()
    assert np.abs(ours - ref).max() <= POSITION_ATOL


def test_position_weights_rows_are_normalised_and_padding_repeats_row0():
    w = position_weights(16, (24, 42), 1024)
    assert w.shape == (1024, 256) and w.dtype == np.float32
    np.testing.assert_allclose(w.sum(1), 1.0, atol=POSITION_ATOL)
    np.testing.assert_array_equal(w[1008:], np.broadcast_to(w[0], (16, 256)))
    with pytest.raises(ValueError):
        position_weights(16, (33, 32), 1024)
