"""Random-weight SigLIP2 checkpoints, built deterministically by transformers from a config.

No weights can be downloaded on a build or CI machine, so fidelity (masc-engine vs the reference
`masc-metric` 0.3.0) is measured on random weights that both sides load from the same local
directory. These models score nothing meaningful: the manifest of a bundle made from them says
`"random_weights": true` and the scorer warns.

Presets (name -> shapes):

- ``random:tiny-naflex``: Siglip2Model, NaFlex, width 64, 2 layers; for tests.
- ``random:tiny-fixed``: SiglipModel (the fixed-size SigLIP2 layout, like
  ``google/siglip2-base-patch16-512``), 128 x 128 input, patch 16; for tests.
- ``random:base-naflex``: the shapes of ``google/siglip2-base-patch16-naflex``; for benchmarks.
- ``random:so400m-naflex``: the shapes of ``google/siglip2-so400m-patch16-naflex``; for benchmarks.

Segmenter presets (CLIPSeg, :data:`SEGMENTER_PRESETS`; bundles of kind ``segmenter``,
export/segmenter.py):

- ``random:clipseg-tiny``: CLIPSegForImageSegmentation, widths 32-64, 4 vision and 2 text layers,
  the real checkpoint's 352 x 352 input, patch 16 and 224-pixel position grid (so the position
  embeddings are interpolated as the real model's are); for tests.
- ``random:clipseg-rd64``: the shapes of ``CIDAS/clipseg-rd64-refined`` (ViT-B/16 vision tower,
  12 layers of width 768; text tower 12 x 512; vocabulary 49,408 rows; decoder reduce_dim 64 with
  the "refined" transposed convolutions); for benchmarks.

Embedder presets (:data:`EMBEDDER_PRESETS`; bundles of kind ``embedder``, export/embedders.py):
the real checkpoints' image sizes and patch sizes with tiny widths and depth, for tests.

- ``random:clip-tiny``: CLIPModel, patch 32, 224 x 224 (openai/clip-vit-base-patch32's layout),
  vision width 64, text width 32, 2 layers each, projection 32; the CLIP-layout test tokenizer.
- ``random:dino-tiny-s16`` / ``random:dino-tiny-s8``: ViTModel (no pooler), patch 16 / 8, 224 x
  224, width 48, 2 layers; ``layer_norm_eps`` 1e-12 in config.json as on the Hub
  (facebook/dino-vits16), which the export replaces with DINO's 1e-6.
- ``random:dinov2-tiny``: Dinov2Model, patch 14, trained grid 518 / 14 = 37 (facebook/dinov2-small's),
  width 48, 2 layers.
- ``random:clip-tiny-l14``: CLIPModel, patch 14, 224 x 224 (openai/clip-vit-large-patch14's layout,
  torchmetrics' CLIPScore default: a 16 x 16 grid), vision width 64, text width 32, 2 layers each,
  projection 48; for tests.

Embedder presets of the real checkpoints' shapes (:data:`EMBEDDER_BENCH_PRESETS`; for benchmarks,
never exported by the tests): ``random:clip-b32`` (openai/clip-vit-base-patch32: vision 768 x 12,
text 512 x 12, projection 512), ``random:clip-l14`` (openai/clip-vit-large-patch14: vision 1024 x
24, text 768 x 12, projection 768), ``random:dino-s16`` (facebook/dino-vits16: 384 x 12, 6 heads).
Their text towers use the test tokenizer's vocabulary (a few hundred rows instead of 49,408: the
text tower's cost does not depend on it beyond the embedding lookup).

The test tokenizers (a SigLIP2-layout and a CLIP-layout BPE, trained on a fixed built-in corpus)
come from export/random_tokenizers.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .random_tokenizers import _train_clip_tokenizer, _train_tokenizer

RANDOM_PREFIX = "random:"


@dataclass(frozen=True)
class RandomPreset:
    """Shapes of one random-weight test model."""

    naflex: bool
    vision_width: int
    vision_layers: int
    vision_heads: int
    vision_mlp: int
    text_width: int
    text_layers: int
    text_heads: int
    text_mlp: int
    patch_size: int = 16
    num_patches: int = 256  # NaFlex: position-embedding grid 16 x 16
    image_size: int = 128  # fixed-size only
    max_num_patches: int = 1024  # NaFlex processor default written into the checkpoint
    seed: int = 0


PRESETS: dict[str, RandomPreset] = {
    "tiny-naflex": RandomPreset(True, 64, 2, 4, 128, 64, 2, 4, 128),
    "tiny-fixed": RandomPreset(False, 64, 2, 4, 128, 64, 2, 4, 128, image_size=128),
    "base-naflex": RandomPreset(True, 768, 12, 12, 3072, 768, 12, 12, 3072),
    "so400m-naflex": RandomPreset(True, 1152, 27, 16, 4304, 1152, 27, 16, 4304),
}


@dataclass(frozen=True)
class SegmenterPreset:
    """Shapes of one random-weight CLIPSeg model (CLIPSegConfig fields)."""

    vision_width: int
    vision_layers: int
    vision_heads: int
    vision_mlp: int
    text_width: int
    text_layers: int
    text_heads: int
    text_mlp: int
    projection_dim: int
    reduce_dim: int
    extract_layers: tuple[int, ...]
    decoder_heads: int
    decoder_mlp: int
    complex_transposed_convolution: bool
    vocab_size: int | None = None  # None: the test tokenizer's own size
    patch_size: int = 16
    position_grid_pixels: int = 224  # vision_config.image_size: the trained position grid (14 x 14)
    input_size: int = 352  # the processor's resize target (CIDAS/clipseg-rd64-refined)
    seed: int = 0


SEGMENTER_PRESETS: dict[str, SegmenterPreset] = {
    "clipseg-tiny": SegmenterPreset(
        64,
        4,
        4,
        128,
        32,
        2,
        4,
        64,
        projection_dim=32,
        reduce_dim=16,
        extract_layers=(1, 2, 3),
        decoder_heads=4,
        decoder_mlp=32,
        complex_transposed_convolution=True,
    ),
    # CIDAS/clipseg-rd64-refined config.json (transformers' CLIPSegConfig defaults plus
    # reduce_dim 64, patch_size 16, use_complex_transposed_convolution true).
    "clipseg-rd64": SegmenterPreset(
        768,
        12,
        12,
        3072,
        512,
        12,
        8,
        2048,
        projection_dim=512,
        reduce_dim=64,
        extract_layers=(3, 6, 9),
        decoder_heads=4,
        decoder_mlp=2048,
        complex_transposed_convolution=True,
        vocab_size=49408,
    ),
}


@dataclass(frozen=True)
class EmbedderPreset:
    """Shapes of one random-weight embedder (``family``: ``clip``, ``dino`` or ``dinov2``)."""

    family: str
    width: int
    layers: int
    heads: int
    mlp: int
    patch_size: int
    image_size: int  # the config's image_size (DINOv2: the trained position grid, 518)
    text_width: int = 0
    text_layers: int = 0
    text_heads: int = 0
    text_mlp: int = 0
    projection_dim: int = 0
    layer_norm_eps: float = 1e-12  # ViT's config.json value on the Hub (DINO's code uses 1e-6)
    seed: int = 0


EMBEDDER_PRESETS: dict[str, EmbedderPreset] = {
    "clip-tiny": EmbedderPreset(
        "clip",
        64,
        2,
        4,
        128,
        32,
        224,
        text_width=32,
        text_layers=2,
        text_heads=4,
        text_mlp=64,
        projection_dim=32,
        layer_norm_eps=1e-5,
    ),
    "dino-tiny-s16": EmbedderPreset("dino", 48, 2, 4, 96, 16, 224),
    "dino-tiny-s8": EmbedderPreset("dino", 48, 2, 4, 96, 8, 224),
    "dinov2-tiny": EmbedderPreset("dinov2", 48, 2, 4, 192, 14, 518, layer_norm_eps=1e-6),
    "clip-tiny-l14": EmbedderPreset(
        "clip",
        64,
        2,
        4,
        128,
        14,
        224,
        text_width=32,
        text_layers=2,
        text_heads=4,
        text_mlp=64,
        projection_dim=48,
        layer_norm_eps=1e-5,
    ),
    # The real checkpoints' shapes (config.json of each Hub id), for benchmarks.
    "clip-b32": EmbedderPreset(
        "clip",
        768,
        12,
        12,
        3072,
        32,
        224,
        text_width=512,
        text_layers=12,
        text_heads=8,
        text_mlp=2048,
        projection_dim=512,
        layer_norm_eps=1e-5,
    ),
    "clip-l14": EmbedderPreset(
        "clip",
        1024,
        24,
        16,
        4096,
        14,
        224,
        text_width=768,
        text_layers=12,
        text_heads=12,
        text_mlp=3072,
        projection_dim=768,
        layer_norm_eps=1e-5,
    ),
    "dino-s16": EmbedderPreset("dino", 384, 12, 6, 1536, 16, 224),
}
#: The presets of real checkpoint shapes: for benchmarks, too large for the tests' exports.
EMBEDDER_BENCH_PRESETS = ("clip-b32", "clip-l14", "dino-s16")
#: The presets the tests export (tiny widths, the real image and patch sizes).
EMBEDDER_TEST_PRESETS = tuple(k for k in EMBEDDER_PRESETS if k not in EMBEDDER_BENCH_PRESETS)


def is_random_model_id(model: str) -> bool:
    return model.startswith(RANDOM_PREFIX)


#: The test tokenizers' vocabulary sizes (export/random_tokenizers.py: the SigLIP2 trainer's
#: target; CLIP's layout: the 512 byte symbols plus merges, within this bound): what
#: :func:`preset_config` counts.
_SIGLIP_TEST_VOCAB, _CLIP_TEST_VOCAB = 420, 1024


def preset_config(name: str) -> dict:
    """A ``config.json``-shaped dict of a ``random:`` preset (the shapes only, nothing built):
    what export/config_budget.py checks against the memory budget before the checkpoint is made.

    Raises:
        KeyError: an unknown preset.
    """
    key = name[len(RANDOM_PREFIX) :] if is_random_model_id(name) else name
    if key in EMBEDDER_PRESETS:
        return _embedder_config(EMBEDDER_PRESETS[key])
    if key in SEGMENTER_PRESETS:
        q = SEGMENTER_PRESETS[key]
        return {
            "model_type": "clipseg",
            "projection_dim": q.projection_dim,
            "reduce_dim": q.reduce_dim,
            "decoder_intermediate_size": q.decoder_mlp,
            "extract_layers": list(q.extract_layers),
            "vision_config": {
                "hidden_size": q.vision_width,
                "intermediate_size": q.vision_mlp,
                "num_hidden_layers": q.vision_layers,
                "patch_size": q.patch_size,
                "image_size": q.position_grid_pixels,
            },
            "text_config": {
                "hidden_size": q.text_width,
                "intermediate_size": q.text_mlp,
                "num_hidden_layers": q.text_layers,
                "vocab_size": q.vocab_size or _CLIP_TEST_VOCAB,
                "max_position_embeddings": 77,
            },
        }
    p = PRESETS[key]
    vision = {
        "hidden_size": p.vision_width,
        "intermediate_size": p.vision_mlp,
        "num_hidden_layers": p.vision_layers,
        "patch_size": p.patch_size,
    }
    vision.update({"num_patches": p.num_patches} if p.naflex else {"image_size": p.image_size})
    return {
        "model_type": "siglip2" if p.naflex else "siglip",
        "vision_config": vision,
        "text_config": {
            "hidden_size": p.text_width,
            "intermediate_size": p.text_mlp,
            "num_hidden_layers": p.text_layers,
            "vocab_size": _SIGLIP_TEST_VOCAB,
            "max_position_embeddings": 64,
        },
    }


def _embedder_config(e: EmbedderPreset) -> dict:
    """The ``config.json`` shapes of an embedder preset (CLIPConfig, ViTConfig or Dinov2Config)."""
    tower = {
        "hidden_size": e.width,
        "num_hidden_layers": e.layers,
        "patch_size": e.patch_size,
        "image_size": e.image_size,
    }
    if e.family == "clip":
        return {
            "model_type": "clip",
            "projection_dim": e.projection_dim,
            "vision_config": {**tower, "intermediate_size": e.mlp},
            "text_config": {
                "hidden_size": e.text_width,
                "intermediate_size": e.text_mlp,
                "num_hidden_layers": e.text_layers,
                "vocab_size": _CLIP_TEST_VOCAB,
                "max_position_embeddings": 77,
            },
        }
    if e.family == "dino":
        return {"model_type": "vit", "intermediate_size": e.mlp, **tower}
    return {"model_type": "dinov2", "mlp_ratio": e.mlp // e.width, **tower}


def build_random_checkpoint(name: str, save_dir: str | Path) -> Path:
    """Build preset `name` (with or without the ``random:`` prefix) into `save_dir`.

    The directory then loads with ``AutoModel.from_pretrained`` / ``AutoProcessor.from_pretrained``
    like a Hub checkpoint. Deterministic: the same preset, torch and transformers versions give
    the same weights (seeded with ``preset.seed``).

    Raises:
        KeyError: unknown preset name (the message lists the known ones).
    """
    import torch
    from transformers import (
        PreTrainedModel,
        ProcessorMixin,
        Siglip2Config,
        Siglip2Model,
        Siglip2Processor,
        SiglipConfig,
        SiglipModel,
        SiglipProcessor,
    )
    from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil
    from transformers.models.siglip2.image_processing_pil_siglip2 import Siglip2ImageProcessorPil

    key = name[len(RANDOM_PREFIX) :] if is_random_model_id(name) else name
    if key in SEGMENTER_PRESETS:
        return build_random_clipseg(key, save_dir)
    if key in EMBEDDER_PRESETS:
        return build_random_embedder(key, save_dir)
    if key not in PRESETS:
        raise KeyError(f"unknown random model {name!r}; known: {', '.join(RANDOM_PREFIX + k for k in preset_names())}")
    p = PRESETS[key]
    save_dir = Path(save_dir)
    save_dir.mkdir(parents=True, exist_ok=True)

    tok = _train_tokenizer(save_dir)
    text = dict(
        vocab_size=len(tok),
        hidden_size=p.text_width,
        intermediate_size=p.text_mlp,
        num_hidden_layers=p.text_layers,
        num_attention_heads=p.text_heads,
        max_position_embeddings=64,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    vision = dict(
        hidden_size=p.vision_width,
        intermediate_size=p.vision_mlp,
        num_hidden_layers=p.vision_layers,
        num_attention_heads=p.vision_heads,
        patch_size=p.patch_size,
    )
    torch.manual_seed(p.seed)
    model: PreTrainedModel
    processor: ProcessorMixin
    if p.naflex:
        naflex_config = Siglip2Config(text_config=text, vision_config={**vision, "num_patches": p.num_patches})
        model = Siglip2Model(naflex_config)
        naflex_images = Siglip2ImageProcessorPil(patch_size=p.patch_size, max_num_patches=p.max_num_patches)
        processor = Siglip2Processor(image_processor=naflex_images, tokenizer=tok)
    else:
        config = SiglipConfig(text_config=text, vision_config={**vision, "image_size": p.image_size})
        model = SiglipModel(config)
        image_processor = SiglipImageProcessorPil(
            size={"height": p.image_size, "width": p.image_size},
            resample=2,  # PIL BILINEAR, as google/siglip2-base-patch16-512's preprocessor_config
            image_mean=[0.5, 0.5, 0.5],
            image_std=[0.5, 0.5, 0.5],
        )
        processor = SiglipProcessor(image_processor=image_processor, tokenizer=tok)
    model.eval()
    model.save_pretrained(save_dir)
    processor.save_pretrained(save_dir)
    (save_dir / "masc_random_model.json").write_text(
        json.dumps({"preset": key, "seed": p.seed, "random_weights": True}, indent=2)
    )
    return save_dir


def preset_names() -> list[str]:
    """Every preset name (without the ``random:`` prefix): SigLIP2 scorers, segmenters, embedders."""
    return list(PRESETS) + list(SEGMENTER_PRESETS) + list(EMBEDDER_PRESETS)


def build_random_clipseg(key: str, save_dir: str | Path) -> Path:
    """Build the CLIPSeg preset ``key`` (:data:`SEGMENTER_PRESETS`) into ``save_dir``: a
    ``CLIPSegForImageSegmentation`` with a ``CLIPSegProcessor`` (transformers' PIL-backed ViT image
    processor with CIDAS/clipseg-rd64-refined's preprocessor_config.json settings: 352 x 352,
    bilinear, rescale 1/255, ImageNet mean and std; the CLIP-layout test tokenizer).

    The text config keeps the real checkpoint's legacy ``eos_token_id = 2`` (pooling at the
    highest token id), so the exported text graph takes the real model's code path.
    """
    import torch
    from transformers import CLIPSegConfig, CLIPSegForImageSegmentation, CLIPSegProcessor
    from transformers.models.vit.image_processing_pil_vit import ViTImageProcessorPil

    p = SEGMENTER_PRESETS[key]
    save_dir = Path(save_dir)
    save_dir.mkdir(parents=True, exist_ok=True)
    tok = _train_clip_tokenizer(save_dir)
    text = dict(
        vocab_size=p.vocab_size or len(tok),
        hidden_size=p.text_width,
        intermediate_size=p.text_mlp,
        num_hidden_layers=p.text_layers,
        num_attention_heads=p.text_heads,
        max_position_embeddings=77,
        pad_token_id=tok.pad_token_id,
        bos_token_id=0,
        eos_token_id=2,
    )
    vision = dict(
        hidden_size=p.vision_width,
        intermediate_size=p.vision_mlp,
        num_hidden_layers=p.vision_layers,
        num_attention_heads=p.vision_heads,
        patch_size=p.patch_size,
        image_size=p.position_grid_pixels,
    )
    config = CLIPSegConfig(
        text_config=text,
        vision_config=vision,
        projection_dim=p.projection_dim,
        reduce_dim=p.reduce_dim,
        extract_layers=list(p.extract_layers),
        decoder_num_attention_heads=p.decoder_heads,
        decoder_intermediate_size=p.decoder_mlp,
        use_complex_transposed_convolution=p.complex_transposed_convolution,
    )
    torch.manual_seed(p.seed)
    model = CLIPSegForImageSegmentation(config).eval()
    image_processor = ViTImageProcessorPil(
        size={"height": p.input_size, "width": p.input_size},
        resample=2,
        image_mean=[0.485, 0.456, 0.406],
        image_std=[0.229, 0.224, 0.225],
    )
    CLIPSegProcessor(image_processor=image_processor, tokenizer=tok).save_pretrained(save_dir)
    model.save_pretrained(save_dir)
    (save_dir / "masc_random_model.json").write_text(
        json.dumps({"preset": key, "seed": p.seed, "random_weights": True, "kind": "segmenter"}, indent=2)
    )
    return save_dir


def random_embedder_model(key: str, seed: int | None = None, vocab_size: int = _CLIP_TEST_VOCAB):
    """The random-weight model of embedder preset ``key`` (:data:`EMBEDDER_PRESETS`), drawn with
    ``seed`` (default: the preset's): ``CLIPModel``, ``ViTModel`` without pooler (config eps as
    the preset's, 1e-12 for DINO as on the Hub) or ``Dinov2Model``, in eval mode."""
    import torch
    from transformers import CLIPConfig, CLIPModel, Dinov2Config, Dinov2Model, ViTConfig, ViTModel

    e = EMBEDDER_PRESETS[key]
    tower: dict[str, Any] = dict(  # ints and a float: the shared config keyword arguments
        hidden_size=e.width,
        num_hidden_layers=e.layers,
        num_attention_heads=e.heads,
        patch_size=e.patch_size,
        image_size=e.image_size,
        layer_norm_eps=e.layer_norm_eps,
    )
    torch.manual_seed(e.seed if seed is None else seed)
    if e.family == "clip":
        text = dict(
            vocab_size=vocab_size,
            hidden_size=e.text_width,
            intermediate_size=e.text_mlp,
            num_hidden_layers=e.text_layers,
            num_attention_heads=e.text_heads,
            max_position_embeddings=77,
            pad_token_id=1,
            bos_token_id=0,
            eos_token_id=2,
        )  # openai's legacy ids: pooled at argmax
        config = CLIPConfig(
            text_config=text, vision_config={**tower, "intermediate_size": e.mlp}, projection_dim=e.projection_dim
        )
        return CLIPModel(config).eval()
    if e.family == "dino":
        return ViTModel(ViTConfig(intermediate_size=e.mlp, qkv_bias=True, **tower), add_pooling_layer=False).eval()
    return Dinov2Model(Dinov2Config(mlp_ratio=e.mlp // e.width, **tower)).eval()


def build_random_embedder(key: str, save_dir: str | Path) -> Path:
    """Build the embedder preset ``key`` into ``save_dir`` (:func:`random_embedder_model`; for
    ``clip``, a ``CLIPProcessor`` with transformers' PIL CLIP image processor and the CLIP-layout
    test tokenizer, whose ``<|endoftext|>`` has the highest id as in openai's vocabulary)."""
    save_dir = Path(save_dir)
    save_dir.mkdir(parents=True, exist_ok=True)
    e = EMBEDDER_PRESETS[key]
    if e.family == "clip":
        from transformers import CLIPProcessor
        from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

        tok = _train_clip_tokenizer(save_dir)
        model = random_embedder_model(key, vocab_size=len(tok))
        CLIPProcessor(image_processor=CLIPImageProcessorPil(), tokenizer=tok).save_pretrained(save_dir)
    else:
        model = random_embedder_model(key)
    model.save_pretrained(save_dir)
    (save_dir / "masc_random_model.json").write_text(
        json.dumps({"preset": key, "seed": e.seed, "random_weights": True, "kind": "embedder"}, indent=2)
    )
    return save_dir
