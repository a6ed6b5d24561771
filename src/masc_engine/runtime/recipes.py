"""Torch-free image preprocessing of the classic personalization metrics (CLIP-I, DINO, DINOv2),
equal to the reference pipelines pixel for pixel.

A recipe (:class:`ImageRecipe`) is data: an embedder bundle's manifest records it as its ``recipe``
table (:meth:`ImageRecipe.to_manifest`; export/embedders.py ``RECIPE_FIELDS``), the runtime reads
it back (:meth:`ImageRecipe.from_manifest`); nothing is chosen from a model name. Each stage is
ported from its reference:

- Loading (DreamBench++ ``dreambench_plus/utils/image_utils.py`` ``load_image``, and transformers
  5.24.0 ``image_transforms.convert_to_rgb``): EXIF orientation applied
  (``PIL.ImageOps.exif_transpose``); an image with transparency (an ``A`` band: RGBA, LA, PA; or a
  ``transparency`` entry: P, L, RGB with a transparent colour) composited on opaque white with
  ``Image.alpha_composite``; then ``convert("RGB")``.
- Resize size: transformers ``image_transforms.get_resize_output_image_size`` with
  ``default_to_square=False`` and torchvision ``transforms/functional.py``
  ``_compute_resized_output_size`` for an int size give the same rule: the short side becomes
  ``size``, the long side ``int(size * long / short)``. ``fixed`` resizes to ``size x size``.
- Resampling: Pillow ``Image.resize`` on the uint8 RGB image (transformers' PIL backend
  ``image_transforms.resize``; torchvision's PIL path ``F_pil.resize``; Pillow antialiases
  bicubic and bilinear by its support scaling, there is no switch).
- Centre crop: ``hf_floor`` is transformers ``image_transforms.center_crop``
  (``top = (h - crop) // 2``); ``torchvision_round`` is torchvision ``functional.center_crop``
  (``crop_top = int(round((image_height - crop_height) / 2.0))``, Python's round: half to even).
  On an odd margin they are one pixel apart (333x517 at 224: offsets 61 and 62).
- Rescale and normalise: transformers ``rescale`` (float64 multiply, cast to float32) then
  ``normalize`` in float32; torchvision ``ToTensor`` (float32 ``div(255)``) then ``Normalize``
  (float32 ``sub_``/``div_``). Both give the same float32 values for every uint8 value at 1/255
  (tests/test_recipes.py checks all 256).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Collection
from dataclasses import dataclass, fields
from typing import Any, NoReturn

import numpy as np
from PIL import Image, ImageOps

from ..engine.manifest import MAX_IMAGE_SIDE
from ..errors import BundleError
from .preprocess import rescale_normalise

#: Accepted ``resize_mode`` values: the short side to ``size`` (aspect kept), or ``size x size``.
RESIZE_MODES = ("shortest_edge", "fixed")
#: Accepted ``interpolation`` values -> Pillow filters.
INTERPOLATIONS = {"bicubic": Image.Resampling.BICUBIC, "bilinear": Image.Resampling.BILINEAR}
#: Accepted ``crop_rounding`` values (see the module docstring for their sources).
CROP_ROUNDINGS = ("hf_floor", "torchvision_round")
#: Accepted ``alpha`` values: ``composite_on_white`` (transparency composited on opaque white, then
#: RGB), the one rule of every reference (engine/manifest.py ``check_embedder`` accepts it alone).
ALPHA_MODES = ("composite_on_white",)
#: Largest ``size`` accepted, in pixels (the bundle reader's bound on an image side).
MAX_RECIPE_SIDE = MAX_IMAGE_SIDE

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


class RecipeError(BundleError, ValueError):
    """A preprocessing recipe has an unknown mode, a missing or unknown field, or a value out of
    range; the one-line message names the field, the value and what is accepted."""


def _fail(field: str, value: object, accepted: str) -> NoReturn:
    shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
    raise RecipeError(f"image recipe {field} is {shown}; it must be {accepted}")


def _int_field(field: str, value: Any, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not lo <= value <= hi:
        _fail(field, value, f"an integer from {lo} to {hi}")
    return int(value)


def _number(field: str, value: Any, positive: bool) -> float:
    ok = not isinstance(value, bool) and isinstance(value, (int, float, np.floating)) and math.isfinite(value)
    if not ok or (positive and value <= 0):
        _fail(field, value, "a finite number above 0" if positive else "a finite number")
    return float(value)


def _triple(field: str, value: Any, positive: bool) -> tuple[float, float, float]:
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__") or len(value) != 3:
        _fail(field, value, "3 numbers, one a channel (R, G, B)")
    r, g, b = (_number(field, v, positive) for v in value)
    return r, g, b


def _choice(field: str, value: Any, allowed: Collection[str]) -> str:
    if not isinstance(value, str) or value not in allowed:
        _fail(field, value, "one of " + ", ".join(map(repr, allowed)))
    return value


def _crop(value: Any) -> tuple[int, int] | None:
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__") or len(value) != 2:
        _fail("crop_size", value, "[height, width] in pixels, or null (no crop)")
    h, w = (_int_field("crop_size", v, 1, MAX_RECIPE_SIDE) for v in value)
    return h, w


@dataclass(frozen=True)
class ImageRecipe:
    """How one classic metric's reference turns a PIL image into the model's input.

    Construction validates every field (so a recipe that exists is usable); the manifest keys are
    the field names (the embedder bundle's ``recipe`` table, export/embedders.py ``RECIPE_FIELDS``).

    Args:
        resize_mode: ``"shortest_edge"`` (short side to ``size``, long side
            ``int(size * long / short)``) or ``"fixed"`` (``size x size``).
        size: pixels, 1 to :data:`MAX_RECIPE_SIDE`.
        interpolation: ``"bicubic"`` or ``"bilinear"`` (Pillow's filters).
        crop_size: ``(height, width)`` of the centre crop in pixels, each 1 to ``size`` (a larger
            crop would pad; no reference recipe does), or None for no crop.
        crop_rounding: ``"hf_floor"`` or ``"torchvision_round"`` (the crop offset of an odd
            margin); None is accepted only without a crop.
        image_mean: per-channel mean (R, G, B), finite, subtracted after rescaling.
        image_std: per-channel standard deviation (R, G, B), finite and > 0.
        rescale_factor: multiplier of the uint8 values, finite and > 0 (1/255 in every reference).
        exif_transpose: apply the EXIF orientation before anything else.
        alpha: ``"composite_on_white"``: transparency composited on opaque white, then RGB.
        follows: the reference pipeline the recipe reproduces (free text, for the reader).

    Raises:
        RecipeError: a value of an unknown kind or out of its range (one line, naming the field).
    """

    resize_mode: str
    size: int
    interpolation: str
    crop_size: tuple[int, int] | None
    crop_rounding: str | None
    image_mean: tuple[float, float, float]
    image_std: tuple[float, float, float]
    rescale_factor: float = 1 / 255
    exif_transpose: bool = True
    alpha: str = "composite_on_white"
    follows: str = ""

    def __post_init__(self) -> None:
        _choice("resize_mode", self.resize_mode, RESIZE_MODES)
        size = _int_field("size", self.size, 1, MAX_RECIPE_SIDE)
        _choice("interpolation", self.interpolation, tuple(INTERPOLATIONS))
        crop = _crop(self.crop_size)
        if crop is not None and max(crop) > size:
            _fail("crop_size", self.crop_size, f"at most size ({size}) on each side: a larger crop would pad")
        if crop is not None or self.crop_rounding is not None:
            _choice("crop_rounding", self.crop_rounding, CROP_ROUNDINGS)
        _choice("alpha", self.alpha, ALPHA_MODES)
        if not isinstance(self.exif_transpose, bool):
            _fail("exif_transpose", self.exif_transpose, "true or false")
        if not isinstance(self.follows, str):
            _fail("follows", self.follows, "a text")
        set_ = functools.partial(object.__setattr__, self)
        set_("size", size)
        set_("crop_size", crop)
        set_("image_mean", _triple("image_mean", self.image_mean, positive=False))
        set_("image_std", _triple("image_std", self.image_std, positive=True))
        set_("rescale_factor", _number("rescale_factor", self.rescale_factor, positive=True))

    @classmethod
    def from_manifest(cls, d: object) -> "ImageRecipe":
        """The recipe a manifest records (the keys are the field names, every one required).

        Args:
            d: the manifest's ``recipe`` table (``crop_size``, ``image_mean``, ``image_std`` as lists).

        Returns:
            The validated recipe.

        Raises:
            RecipeError: not a table, a key missing or unknown (a newer recipe field is refused,
                not ignored), or a value out of range.
        """
        if not isinstance(d, dict):
            raise RecipeError(f"image recipe is {type(d).__name__}, not a table")
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(d) - set(names))
        if unknown:
            raise RecipeError(f"image recipe has unknown field(s) {', '.join(unknown)}; known: {', '.join(names)}")
        missing = [n for n in names if n not in d]
        if missing:
            raise RecipeError(f"image recipe lacks field(s) {', '.join(missing)}")
        return cls(**{n: d[n] for n in names})

    def to_manifest(self) -> dict[str, Any]:
        """The recipe as a JSON-able table (:meth:`from_manifest` reads it back equal)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        for key in ("crop_size", "image_mean", "image_std"):
            out[key] = None if out[key] is None else list(out[key])
        return out


#: CLIP-I / CLIP-T image side as DreamBench++ computes it (``dreambench_plus/metrics/clip_score.py``:
#: ``CLIPImageProcessor`` of ``openai/clip-vit-base-patch32``; transformers
#: ``models/clip/image_processing_pil_clip.py`` defaults): shortest edge 224 bicubic, HF centre
#: crop 224 (offset ``(h - 224) // 2``), OpenAI CLIP mean/std.
CLIP_B32_DREAMBENCH = ImageRecipe(
    "shortest_edge",
    224,
    "bicubic",
    (224, 224),
    "hf_floor",
    CLIP_MEAN,
    CLIP_STD,
    follows="transformers CLIPImageProcessor (PIL), as DreamBench++ clip_score.py",
)

#: DINO v1 (ViT-S/16 or S/8) as DreamBooth-style evaluations and DreamBench++
#: (``dreambench_plus/metrics/dino_score.py``; facebookresearch/dino ``eval_knn.py``) compute it:
#: torchvision ``Resize(256, BICUBIC)`` on the short side, ``CenterCrop(224)`` (offset
#: ``int(round((h - 224) / 2.0))``, half to even), ``ToTensor``, ImageNet mean/std.
DINO_V1_EVAL = ImageRecipe(
    "shortest_edge",
    256,
    "bicubic",
    (224, 224),
    "torchvision_round",
    IMAGENET_MEAN,
    IMAGENET_STD,
    follows="torchvision Resize(256, bicubic) + CenterCrop(224), "
    "facebookresearch/dino eval_knn.py, DreamBench++ dino_score.py",
)

#: DINOv2 as DreamBench++ computes it (``dino_score.py`` ``Dinov2Score``: ``BitImageProcessor`` of
#: ``facebook/dinov2-small``; transformers ``models/bit/image_processing_pil_bit.py``): shortest edge
#: 256 bicubic, HF centre crop 224, ImageNet mean/std.
DINOV2_HF = ImageRecipe(
    "shortest_edge",
    256,
    "bicubic",
    (224, 224),
    "hf_floor",
    IMAGENET_MEAN,
    IMAGENET_STD,
    follows="transformers BitImageProcessor (PIL), as DreamBench++ dino_score.py",
)

#: torchmetrics' ``CLIPScore`` image side (Lightning-AI/torchmetrics 1.9.0
#: ``functional/multimodal/clip_score.py`` ``_get_features``: ``CLIPProcessor.from_pretrained`` of
#: openai/clip-vit-large-patch14, its images given as ``[C, H, W]`` 0-255 tensors): that
#: checkpoint's preprocessor_config.json has B/32's values, so the pixels are
#: :data:`CLIP_B32_DREAMBENCH`'s (transformers' PIL processor gives the same pixels from a uint8
#: tensor as from the PIL image). Where transformers 5 loads the torchvision backend instead
#: (torchvision installed), torchmetrics' pixels differ from these by up to ~0.0175.
CLIP_L14_TORCHMETRICS = ImageRecipe(
    "shortest_edge",
    224,
    "bicubic",
    (224, 224),
    "hf_floor",
    CLIP_MEAN,
    CLIP_STD,
    follows="transformers CLIPImageProcessor (PIL) of openai/clip-vit-large-patch14, as torchmetrics CLIPScore",
)

#: The named recipes, by the name a manifest or a report may give.
NAMED_RECIPES = {
    "clip_b32_dreambench": CLIP_B32_DREAMBENCH,
    "dino_v1_eval": DINO_V1_EVAL,
    "dinov2_hf": DINOV2_HF,
    "clip_l14_torchmetrics": CLIP_L14_TORCHMETRICS,
}


def has_transparency(image: Image.Image) -> bool:
    """Whether ``image`` carries transparency: an alpha band (RGBA, LA, PA, ...) or a
    ``transparency`` entry (a palette index, a grey or RGB colour). transformers 5.24.0
    ``image_transforms.convert_to_rgb``'s test."""
    return "A" in image.getbands() or image.info.get("transparency") is not None


def load_rgb(image: Image.Image, recipe: ImageRecipe) -> Image.Image:
    """``image`` as the references load it: EXIF orientation applied (when the recipe says so), then
    transparency composited on white, then RGB.

    Args:
        image: any PIL image (not modified).
        recipe: the recipe (its ``exif_transpose`` and ``alpha``).

    Returns:
        An RGB PIL image, the same size as the oriented input.
    """
    if recipe.exif_transpose:
        image = ImageOps.exif_transpose(image)
    if recipe.alpha == "composite_on_white" and has_transparency(image):
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image if image.mode == "RGB" else image.convert("RGB")


def resized_size(height: int, width: int, recipe: ImageRecipe) -> tuple[int, int]:
    """``(height, width)`` after the recipe's resize of an image of ``height x width`` pixels.

    ``shortest_edge``: transformers ``get_resize_output_image_size(default_to_square=False)`` and
    torchvision ``_compute_resized_output_size`` (int size, no ``max_size``): ``short, long =
    (w, h) if w <= h else (h, w)``; ``new_long = int(size * long / short)``.
    """
    if recipe.resize_mode == "fixed":
        return recipe.size, recipe.size
    short, long = (width, height) if width <= height else (height, width)
    new_short, new_long = recipe.size, int(recipe.size * long / short)
    return (new_long, new_short) if width <= height else (new_short, new_long)


def crop_offset(length: int, crop: int, rounding: str) -> int:
    """Start of a centred crop of ``crop`` pixels in a side of ``length >= crop`` pixels.

    ``hf_floor``: ``(length - crop) // 2`` (transformers ``center_crop``); ``torchvision_round``:
    ``int(round((length - crop) / 2.0))`` (torchvision ``functional.center_crop``; half to even:
    a margin of 123 gives 62, of 173 gives 86).
    """
    if rounding == "hf_floor":
        return (length - crop) // 2
    return int(round((length - crop) / 2.0))


def to_uint8_before_normalise(image: Image.Image, recipe: ImageRecipe) -> np.ndarray:
    """The loaded, resized and cropped image before rescale and normalisation.

    Args:
        image: any PIL image.
        recipe: the recipe.

    Returns:
        ``[H, W, 3] uint8`` (``crop_size``, or the resized size without a crop).
    """
    rgb = load_rgb(image, recipe)
    h, w = resized_size(rgb.height, rgb.width, recipe)
    if (h, w) != (rgb.height, rgb.width):
        rgb = rgb.resize((w, h), resample=INTERPOLATIONS[recipe.interpolation])
    if recipe.crop_size is not None:
        ch, cw = recipe.crop_size
        rounding = recipe.crop_rounding
        if rounding is None:  # a recipe with a crop has its rounding (ImageRecipe checks it)
            raise RecipeError("image recipe crop_rounding is None with a crop_size")
        top, left = crop_offset(h, ch, rounding), crop_offset(w, cw, rounding)
        rgb = rgb.crop((left, top, left + cw, top + ch))
    return np.asarray(rgb, dtype=np.uint8)


def normalise(pixels: np.ndarray, recipe: ImageRecipe) -> np.ndarray:
    """Rescale (float64 multiply, then float32) and normalise (float32) ``[H, W, 3] uint8`` pixels
    (runtime/preprocess.py ``rescale_normalise``: one home for the rule).

    Returns:
        ``[3, H, W] float32``, C-contiguous.
    """
    return rescale_normalise(pixels, recipe.rescale_factor, recipe.image_mean, recipe.image_std)


def preprocess(image: Image.Image, recipe: ImageRecipe) -> np.ndarray:
    """One image as the recipe's reference feeds it to the model.

    Args:
        image: any PIL image (EXIF orientation and transparency handled as the recipe says).
        recipe: the recipe.

    Returns:
        ``[3, H, W] float32`` normalised pixels (``crop_size``, or the resized size).
    """
    return normalise(to_uint8_before_normalise(image, recipe), recipe)
