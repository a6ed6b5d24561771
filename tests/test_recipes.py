"""The classic metrics' preprocessing (runtime/recipes.py) against its references, pixel for pixel.

- CLIP-I and DINOv2 against transformers' PIL-backend image processors (``CLIPImageProcessorPil``,
  ``BitImageProcessorPil``: the original pipelines; the default torchvision-backed classes of
  transformers 5 differ by up to ~0.0175), built offline from their parameters.
- DINO v1 against a reference written here from torchvision's rules on its PIL path, with Pillow
  directly (torchvision is not installed beside this torch build).

Compared: the uint8 image after resize and crop (the stage before rescale, which the references
expose) exactly, and the normalised float32 arrays exactly (measured max |delta| = 0 on every case
below: same Pillow resize, same float32 arithmetic).
"""

from __future__ import annotations

import io
import json
from dataclasses import replace

import numpy as np
import pytest
from PIL import Image, ImageOps

from masc_engine.runtime.recipes import (
    CLIP_B32_DREAMBENCH,
    DINO_V1_EVAL,
    DINOV2_HF,
    IMAGENET_MEAN,
    IMAGENET_STD,
    NAMED_RECIPES,
    ImageRecipe,
    RecipeError,
    crop_offset,
    load_rgb,
    normalise,
    preprocess,
    resized_size,
    to_uint8_before_normalise,
)

#: (height, width): odd margins both ways, an almost square image, a one-pixel-high strip.
SIZES = [(333, 517), (517, 333), (640, 427), (1000, 1001), (1, 300)]


def _noise(h: int, w: int, channels: int = 3, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed + h * 7 + w).integers(0, 256, (h, w, channels), dtype=np.uint8)


def _exif_rotated_jpeg() -> Image.Image:
    """A JPEG stored 517 wide x 333 high whose EXIF orientation 6 shows it 333 wide x 517 high."""
    exif = Image.Exif()
    exif[0x0112] = 6
    buf = io.BytesIO()
    Image.fromarray(_noise(333, 517)).save(buf, "JPEG", exif=exif, quality=95)
    im = Image.open(io.BytesIO(buf.getvalue()))
    assert im.size == (517, 333) and im.getexif()[0x0112] == 6
    return im


def _rgba() -> Image.Image:
    px = _noise(333, 517, 4, seed=1)
    px[:100, :, 3] = 0  # fully transparent rows over coloured pixels
    return Image.fromarray(px, "RGBA")


def _la() -> Image.Image:
    return Image.fromarray(_noise(427, 640, 2, seed=2), "LA")


def _palette_transparent() -> Image.Image:
    im = Image.fromarray(_noise(640, 427, 1, seed=3)[..., 0], "L").convert("P")
    im.putpalette(list(np.random.default_rng(4).integers(0, 256, 768)))
    im.info["transparency"] = int(np.asarray(im)[0, 0])  # the top-left pixel's index is transparent
    return im


def _images() -> dict[str, Image.Image]:
    out = {f"{h}x{w}": Image.fromarray(_noise(h, w)) for h, w in SIZES}
    out.update(exif6=_exif_rotated_jpeg(), rgba=_rgba(), la=_la(), palette_transparent=_palette_transparent())
    return out


IMAGES = _images()


# ---------------------------------------------------------------------------------- references


def _hf_processors() -> dict:
    pil_clip = pytest.importorskip("transformers.models.clip.image_processing_pil_clip")
    pil_bit = pytest.importorskip("transformers.models.bit.image_processing_pil_bit")
    # openai/clip-vit-base-patch32's preprocessor_config is the class's defaults.
    clip = pil_clip.CLIPImageProcessorPil(
        size={"shortest_edge": 224}, crop_size={"height": 224, "width": 224}, resample=3
    )
    # facebook/dinov2-small's preprocessor_config: shortest edge 256, crop 224, bicubic, ImageNet mean/std.
    dinov2 = pil_bit.BitImageProcessorPil(
        size={"shortest_edge": 256},
        crop_size={"height": 224, "width": 224},
        resample=3,
        image_mean=list(IMAGENET_MEAN),
        image_std=list(IMAGENET_STD),
    )
    return {"clip": (clip, CLIP_B32_DREAMBENCH), "dinov2": (dinov2, DINOV2_HF)}


@pytest.fixture(scope="module")
def hf():
    return _hf_processors()


def _hf_loaded(image: Image.Image) -> Image.Image:
    """What the HF processors are given: the image with its EXIF orientation applied (DreamBench++'s
    ``load_image``); transparency is left to the processor's own ``convert_to_rgb`` (composite on white)."""
    return ImageOps.exif_transpose(image)


def torchvision_reference(image: Image.Image) -> tuple[np.ndarray, np.ndarray]:
    """DreamBench++'s DINO v1 pipeline (``load_image``; ``Resize(256, BICUBIC)``, ``CenterCrop(224)``,
    ``ToTensor()``, ``Normalize(ImageNet)``) on torchvision's PIL path, written with Pillow and numpy.

    Ported from pytorch/vision ``torchvision/transforms/functional.py``:
    ``_compute_resized_output_size``: ``short, long = (w, h) if w <= h else (h, w)``;
    ``new_short, new_long = requested_new_short, int(requested_new_short * long / short)``;
    ``new_w, new_h = (new_short, new_long) if w <= h else (new_long, new_short)``.
    ``resize``: ``if [image_height, image_width] == output_size: return img``, else
    ``F_pil.resize`` -> ``img.resize(tuple(size[::-1]), interpolation)`` (BICUBIC).
    ``center_crop``: ``crop_top = int(round((image_height - crop_height) / 2.0))``,
    ``crop_left = int(round((image_width - crop_width) / 2.0))``, ``F_pil.crop`` ->
    ``img.crop((left, top, left + width, top + height))``.
    ``to_tensor``: ``img.to(dtype=torch.get_default_dtype()).div(255)`` (float32);
    ``normalize``: ``tensor.sub_(mean).div_(std)`` with float32 mean and std.

    Returns:
        (``[224, 224, 3] uint8`` after the crop, ``[3, 224, 224] float32`` normalised).
    """
    im = ImageOps.exif_transpose(image)
    # DreamBench++ load_image composites RGBA on white and refuses LA and P; LA and P with
    # transparency are composited too, as transformers' convert_to_rgb does.
    if "A" in im.getbands() or im.info.get("transparency") is not None:
        im = Image.alpha_composite(Image.new("RGBA", im.size, "white"), im.convert("RGBA"))
    im = im.convert("RGB")
    w, h = im.size
    short, long = (w, h) if w <= h else (h, w)
    new_short, new_long = 256, int(256 * long / short)
    new_w, new_h = (new_short, new_long) if w <= h else (new_long, new_short)
    if [h, w] != [new_h, new_w]:
        im = im.resize((new_w, new_h), Image.BICUBIC)
    top, left = int(round((new_h - 224) / 2.0)), int(round((new_w - 224) / 2.0))
    u8 = np.array(im.crop((left, top, left + 224, top + 224)))
    t = u8.transpose(2, 0, 1).astype(np.float32) / np.float32(255)
    mean = np.asarray(IMAGENET_MEAN, np.float32)[:, None, None]
    std = np.asarray(IMAGENET_STD, np.float32)[:, None, None]
    return u8, (t - mean) / std


# ---------------------------------------------------------------------------------- parity


@pytest.mark.parametrize("name", list(IMAGES))
@pytest.mark.parametrize("which", ["clip", "dinov2"])
def test_equals_hf_pil_processor(hf, which, name):
    proc, recipe = hf[which]
    image = IMAGES[name]
    ref_u8 = proc(images=[_hf_loaded(image)], do_rescale=False, do_normalize=False, return_tensors="np")[
        "pixel_values"
    ][0]
    ref = proc(images=[_hf_loaded(image)], return_tensors="np")["pixel_values"][0]
    ours_u8 = to_uint8_before_normalise(image, recipe)
    ours = preprocess(image, recipe)
    assert ref_u8.dtype == ours_u8.dtype == np.uint8 and ours_u8.shape == (224, 224, 3)
    np.testing.assert_array_equal(ours_u8, ref_u8.transpose(1, 2, 0))
    assert ours.dtype == ref.dtype == np.float32 and ours.shape == ref.shape == (3, 224, 224)
    np.testing.assert_array_equal(ours, ref)


@pytest.mark.parametrize("name", list(IMAGES))
def test_dino_v1_equals_torchvision_rules(name):
    ref_u8, ref = torchvision_reference(IMAGES[name])
    np.testing.assert_array_equal(to_uint8_before_normalise(IMAGES[name], DINO_V1_EVAL), ref_u8)
    np.testing.assert_array_equal(preprocess(IMAGES[name], DINO_V1_EVAL), ref)


def test_hf_and_torchvision_crops_differ_by_one_pixel():
    """The trap: on 333x517 at 224, the long side is 347 (margin 123): HF's floor starts the crop at
    61, torchvision's round at 62. Swapping the roundings fails the parity tests above."""
    im = IMAGES["333x517"]
    assert resized_size(333, 517, CLIP_B32_DREAMBENCH) == (224, 347)
    assert crop_offset(347, 224, "hf_floor") == 61 and crop_offset(347, 224, "torchvision_round") == 62
    hf_crop = to_uint8_before_normalise(im, CLIP_B32_DREAMBENCH)
    tv_crop = to_uint8_before_normalise(im, replace(CLIP_B32_DREAMBENCH, crop_rounding="torchvision_round"))
    np.testing.assert_array_equal(hf_crop[:, 1:], tv_crop[:, :-1])  # the same pixels, one column apart
    assert not np.array_equal(hf_crop, tv_crop)
    # 640x427 at 256 (DINO v1): long side 383, margin 159: 79 against 80.
    assert resized_size(640, 427, DINO_V1_EVAL) == (383, 256)
    assert crop_offset(383, 224, "hf_floor") == 79 and crop_offset(383, 224, "torchvision_round") == 80


def test_torchvision_round_is_half_to_even():
    """Python's round: a margin of 173 (333x517 at 256: long side 397) starts at 86, not 87 (which
    ``int(margin / 2 + 0.5)`` would give); 123 starts at 62."""
    assert resized_size(333, 517, DINO_V1_EVAL) == (256, 397)
    assert crop_offset(397, 224, "torchvision_round") == 86
    assert crop_offset(347, 224, "torchvision_round") == 62
    assert crop_offset(397, 224, "hf_floor") == 86


def test_resize_sizes_follow_the_int_rule():
    # short side to size, long side int(size * long / short): truncation, not rounding
    assert resized_size(427, 640, CLIP_B32_DREAMBENCH) == (224, 335)  # 224 * 640 / 427 = 335.7
    assert resized_size(1000, 1001, DINOV2_HF) == (256, 256)  # 256.256
    assert resized_size(1001, 1000, DINOV2_HF) == (256, 256)
    assert resized_size(1, 300, DINO_V1_EVAL) == (256, 76800)
    assert resized_size(300, 1, CLIP_B32_DREAMBENCH) == (67200, 224)
    fixed = replace(
        DINOV2_HF, resize_mode="fixed", size=224, crop_size=None, crop_rounding=None, interpolation="bilinear"
    )
    assert resized_size(333, 517, fixed) == (224, 224)
    assert to_uint8_before_normalise(IMAGES["333x517"], fixed).shape == (224, 224, 3)


def test_rescale_paths_agree_on_every_uint8_value():
    """transformers rescales in float64 then casts; torchvision divides in float32: the same float32
    values for all 256 levels, so one normalise serves both references."""
    levels = np.arange(256, dtype=np.uint8).reshape(16, 16, 1).repeat(3, axis=2)
    ours = normalise(levels, DINO_V1_EVAL)
    tv = (
        levels.transpose(2, 0, 1).astype(np.float32) / np.float32(255)
        - np.asarray(IMAGENET_MEAN, np.float32)[:, None, None]
    ) / np.asarray(IMAGENET_STD, np.float32)[:, None, None]
    np.testing.assert_array_equal(ours, tv)


def test_normalise_uses_the_recipe_rescale_factor():
    """A recipe whose rescale factor is not 1/255 (a checkpoint's preprocessor_config may say
    1/127.5) is rescaled by that factor: float64 multiply, float32, then the float32 normalize."""
    recipe = replace(DINO_V1_EVAL, rescale_factor=1 / 127.5)
    levels = np.arange(256, dtype=np.uint8).reshape(16, 16, 1).repeat(3, axis=2)
    x = (levels.astype(np.float64) * (1 / 127.5)).astype(np.float32)
    want = (x - np.asarray(IMAGENET_MEAN, np.float32)) / np.asarray(IMAGENET_STD, np.float32)
    np.testing.assert_array_equal(normalise(levels, recipe), want.transpose(2, 0, 1))


# ---------------------------------------------------------------------------------- loading


def test_exif_orientation_is_applied():
    im = IMAGES["exif6"]
    assert load_rgb(im, CLIP_B32_DREAMBENCH).size == (333, 517)
    ignored = replace(CLIP_B32_DREAMBENCH, exif_transpose=False)
    assert load_rgb(im, ignored).size == (517, 333)
    assert not np.array_equal(
        to_uint8_before_normalise(im, ignored), to_uint8_before_normalise(im, CLIP_B32_DREAMBENCH)
    )


@pytest.mark.parametrize("name", ["rgba", "la", "palette_transparent"])
def test_transparency_composited_on_white(name):
    im = IMAGES[name]
    rgb = np.asarray(load_rgb(im, DINO_V1_EVAL))
    rgba = im.convert("RGBA")
    want = np.asarray(Image.alpha_composite(Image.new("RGBA", im.size, (255, 255, 255, 255)), rgba).convert("RGB"))
    np.testing.assert_array_equal(rgb, want)
    clear = np.asarray(rgba)[..., 3] == 0
    assert clear.any() and (rgb[clear] == 255).all()  # transparent pixels are white
    assert not np.array_equal(np.asarray(im.convert("RGB")), rgb)  # not Pillow's plain conversion


def test_input_image_not_modified():
    im = IMAGES["rgba"]
    before = np.asarray(im).copy()
    preprocess(im, DINOV2_HF)
    np.testing.assert_array_equal(np.asarray(im), before)
    assert im.mode == "RGBA"


# ---------------------------------------------------------------------------------- the recipe as data


@pytest.mark.parametrize("name", list(NAMED_RECIPES))
def test_manifest_round_trip(name):
    r = NAMED_RECIPES[name]
    d = json.loads(json.dumps(r.to_manifest()))
    assert ImageRecipe.from_manifest(d) == r
    assert d["rescale_factor"] == 1 / 255 and isinstance(d["image_mean"], list)


def test_named_recipes_hold_the_reference_values():
    assert (CLIP_B32_DREAMBENCH.size, CLIP_B32_DREAMBENCH.crop_size, CLIP_B32_DREAMBENCH.crop_rounding) == (
        224,
        (224, 224),
        "hf_floor",
    )
    assert CLIP_B32_DREAMBENCH.image_mean == (0.48145466, 0.4578275, 0.40821073)
    assert CLIP_B32_DREAMBENCH.image_std == (0.26862954, 0.26130258, 0.27577711)
    assert (DINO_V1_EVAL.size, DINO_V1_EVAL.crop_rounding, DINOV2_HF.size, DINOV2_HF.crop_rounding) == (
        256,
        "torchvision_round",
        256,
        "hf_floor",
    )
    for r in NAMED_RECIPES.values():
        assert (r.resize_mode, r.interpolation, r.exif_transpose, r.alpha) == (
            "shortest_edge",
            "bicubic",
            True,
            "composite_on_white",
        )
        assert r.follows and r.crop_size == (224, 224)
    assert DINOV2_HF.image_mean == DINO_V1_EVAL.image_mean == (0.485, 0.456, 0.406)


BAD_FIELDS = [
    ("resize_mode", "longest_edge", "resize_mode"),
    ("interpolation", "lanczos", "interpolation"),
    ("crop_rounding", "ceil", "crop_rounding"),
    ("alpha", "drop", "alpha"),
    ("size", 0, "size"),
    ("size", 8193, "size"),
    ("size", 224.0, "size"),
    ("size", True, "size"),
    ("crop_size", [224, 257], "crop_size"),  # above size: would pad
    ("crop_size", 224, "crop_size"),  # [height, width]
    ("crop_size", [224], "crop_size"),
    ("crop_size", [224.0, 224], "crop_size"),
    ("crop_rounding", None, "crop_rounding"),  # a crop needs its rounding
    ("follows", 3, "follows"),
    ("image_std", [0.2, 0.0, 0.2], "image_std"),
    ("image_mean", [0.5, float("nan"), 0.5], "image_mean"),
    ("image_mean", [0.5, 0.5], "image_mean"),
    ("image_mean", "0.5", "image_mean"),
    ("rescale_factor", -1.0, "rescale_factor"),
    ("exif_transpose", "yes", "exif_transpose"),
]


@pytest.mark.parametrize("field,value,named", BAD_FIELDS, ids=[f"{f}={v!r}" for f, v, _ in BAD_FIELDS])
def test_bad_values_refused_in_one_line(field, value, named):
    d = DINOV2_HF.to_manifest()
    d[field] = value
    with pytest.raises(RecipeError) as e:
        ImageRecipe.from_manifest(d)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"image recipe {named} is ") and "must be" in msg
    assert isinstance(e.value, ValueError)


def test_unknown_and_missing_fields_refused():
    d = DINOV2_HF.to_manifest()
    with pytest.raises(RecipeError, match="unknown field.*antialias"):
        ImageRecipe.from_manifest({**d, "antialias": False})
    del d["crop_rounding"]
    with pytest.raises(RecipeError, match="lacks field.*crop_rounding"):
        ImageRecipe.from_manifest(d)
    with pytest.raises(RecipeError, match="not a table"):
        ImageRecipe.from_manifest([1, 2])


def test_no_crop_keeps_the_resized_image():
    r = replace(DINOV2_HF, crop_size=None, crop_rounding=None)
    assert ImageRecipe.from_manifest(json.loads(json.dumps(r.to_manifest()))) == r
    assert preprocess(IMAGES["640x427"], r).shape == (3, 383, 256)


def test_rectangular_crop():
    r = replace(DINO_V1_EVAL, crop_size=(224, 160))
    assert r.to_manifest()["crop_size"] == [224, 160]
    u8 = to_uint8_before_normalise(IMAGES["640x427"], r)  # resized to 383 x 256
    full = to_uint8_before_normalise(IMAGES["640x427"], replace(r, crop_size=None, crop_rounding=None))
    np.testing.assert_array_equal(u8, full[80:304, 48:208])  # round(159 / 2) = 80, round(96 / 2) = 48


def test_exported_recipe_tables_are_the_named_recipes():
    """The exporter's recipe tables (export/embedders.py ``RECIPES``) read back as the named recipes
    (the ``follows`` text aside)."""
    embedders = pytest.importorskip("masc_engine.export.embedders")
    named = {"clip": CLIP_B32_DREAMBENCH, "dino": DINO_V1_EVAL, "dinov2": DINOV2_HF}
    for family, recipe in named.items():
        table = embedders.RECIPES[family][0]
        assert replace(ImageRecipe.from_manifest(table), follows="") == replace(recipe, follows="")
