"""``masc-export`` for an embedder: CLIP, DINO or DINOv2 -> a validated bundle of kind ``embedder``.

The evaluation table of personalization papers puts CLIP-I, CLIP-T, DINO and DINOv2 beside MaSC
(docs/export.md "Embedder bundles"). Each is an embedding of an image (CLIP also of a text) under
a preprocessing recipe the reference code fixes; the bundle holds the graphs and the recipe as
data, and the runtime computes the scores (cosine of L2-normalised embeddings) without torch.

Models (``--model`` short names; a Hub id or a local folder of the same ``model_type`` too):

- ``clip-vit-b32`` (openai/clip-vit-base-patch32, ``CLIPModel``): graph ``image``
  ``pixel_values [B, 3, 224, 224] f32`` -> ``image_embeds [B, 512] f32`` =
  ``visual_projection(post_layernorm(CLS))``; graph ``text`` ``input_ids [B, S <= 77] i64`` ->
  ``text_embeds [B, 512] f32`` = ``text_projection`` of the end-of-text token's final state (no
  attention mask: the tower is causal, padding after end-of-text is inert, so the sequence axis is
  dynamic and the runtime cuts the padding, runtime/embedder.py ``text_run_lengths``); the tokenizer is saved
  as ``tokenizer.json`` (``tokenizers``), settings in the manifest's ``text`` section.
- ``clip-vit-l14`` (openai/clip-vit-large-patch14, ``CLIPModel``, torchmetrics' ``CLIPScore``
  default): the same two graphs at patch 14 (``image_embeds``/``text_embeds [B, 768]``); its
  preprocessor_config.json has the B/32 values (shortest edge 224 bicubic, centre crop 224, CLIP
  mean/std), so the bundle's recipe is the ``clip`` one.
- ``dino-vits16`` / ``dino-vits8`` (facebook/dino-vits16 / -vits8, ``ViTModel`` without pooler):
  ``image_embeds [B, 384]`` = CLS of ``last_hidden_state`` after the final LayerNorm, with
  LayerNorm eps 1e-6 (DINO's code; the Hub config says 1e-12: the export sets 1e-6 and records both
  in ``architecture``).
- ``dinov2-small`` (facebook/dinov2-small, ``Dinov2Model``): ``image_embeds [B, 384]`` = CLS of
  ``last_hidden_state`` (after the LayerNorm); the 37 x 37 position grid interpolated to 16 x 16 by
  transformers' own bicubic rule, computed at export and stored as a constant (fixed 224 x 224).

Embeddings are NOT normalised: the metric normalises. Dynamic axes: the batch, and the text graph's
sequence; fp32 only.

Manifest ``recipe`` (:data:`RECIPE_FIELDS`, checked by engine/manifest.py ``check_embedder``):
the image preprocessing as data, applied in this order: EXIF transpose, alpha composited on white,
RGB; resize; centre crop; rescale; normalise; ``[3, H, W]`` float32.

Manifest ``embedding``: ``{"image": rule, "text": rule or None, "dim": D, "normalized": false}``,
rules :data:`IMAGE_RULES` / :data:`TEXT_RULES`. ``source``: ``{"model", "revision",
"random_weights"}``. ``family``: ``clip``, ``dino`` or ``dinov2``.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from ..engine.manifest import write_manifest
from ..runtime.recipes import CLIP_B32_DREAMBENCH, CLIP_L14_TORCHMETRICS, DINO_V1_EVAL, DINOV2_HF
from ..runtime.text import clip_pooling_rule
from .checkpoint import OFFLINE_HINT, CheckpointError, checkpoint_source, pin_revision
from .random_models import EMBEDDER_PRESETS

logger = logging.getLogger(__name__)

OPSET = 18
KIND = "embedder"
#: ``config.model_type`` -> family.
EMBEDDER_MODEL_TYPES = {"clip": "clip", "vit": "dino", "dinov2": "dinov2"}
#: Short names accepted by ``--model``.
SHORT_NAMES = {
    "clip-vit-b32": "openai/clip-vit-base-patch32",
    "clip-vit-l14": "openai/clip-vit-large-patch14",
    "dino-vits16": "facebook/dino-vits16",
    "dino-vits8": "facebook/dino-vits8",
    "dinov2-small": "facebook/dinov2-small",
}
#: Graph precisions an embedder exports.
PRECISIONS = ("fp32",)
#: LayerNorm eps of DINO v1 (facebookresearch/dino ``vision_transformer.py``: ``partial(nn.LayerNorm, eps=1e-6)``).
DINO_LAYER_NORM_EPS = 1e-6
#: Embedding rules: how each family's graph reads its embedding.
IMAGE_RULES = ("clip_image_projection", "cls_final_norm", "cls_layernorm")
TEXT_RULES = ("clip_text_projection",)

#: The manifest ``recipe`` schema: field -> meaning (the one documented place; engine/manifest.py
#: checks it, the runtime applies it).
RECIPE_FIELDS = {
    "resize_mode": '"shortest_edge" (scale so the short side is `size`, aspect kept) or "fixed" (to `size` x `size`)',
    "size": "int: the short side's target (shortest_edge) or the square side (fixed), pixels",
    "interpolation": '"bicubic" or "bilinear" (Pillow filters, as the reference pipelines)',
    "crop_size": "[height, width] of the centre crop, or null (no crop)",
    "crop_rounding": '"hf_floor" (top = (h - ch) // 2, transformers) or "torchvision_round" '
    "(top = round((h - ch) / 2), half to even, torchvision CenterCrop); null without crop",
    "rescale_factor": "float, 1/255: uint8 -> [0, 1]",
    "image_mean": "3 floats, per channel (RGB), after rescale",
    "image_std": "3 floats > 0, per channel",
    "exif_transpose": "bool: apply the EXIF orientation first (PIL.ImageOps.exif_transpose)",
    "alpha": '"composite_on_white": an image with alpha is composited on white, then converted to RGB',
    "follows": "str: the reference pipeline the recipe reproduces",
}
#: family -> (recipe, image rule): the manifest tables of the runtime's named recipes
#: (runtime/recipes.py, which cites the sources: yuangpeng/dreambench_plus ``metrics/clip_score.py``
#: and ``metrics/dino_score.py``; facebookresearch/dino ``eval_knn.py``; docs/export.md "Embedder bundles").
RECIPES = {
    "clip": (CLIP_B32_DREAMBENCH.to_manifest(), "clip_image_projection"),
    "dino": (DINO_V1_EVAL.to_manifest(), "cls_final_norm"),
    "dinov2": (DINOV2_HF.to_manifest(), "cls_layernorm"),
}

#: The ``follows`` of a CLIP bundle at patch 14 (openai/clip-vit-large-patch14's layout): the same
#: pixels as the ``clip`` recipe (that checkpoint's preprocessor_config.json has B/32's values),
#: the pipeline of torchmetrics' CLIPScore, whose default checkpoint it is (runtime/recipes.py
#: ``CLIP_L14_TORCHMETRICS``).
CLIP_L14_FOLLOWS = CLIP_L14_TORCHMETRICS.follows


def is_embedder_model(model: str, revision: str | None = None) -> bool:
    """Whether ``model`` (a ``--model`` value) names an embedder checkpoint: a ``random:`` preset
    of :data:`EMBEDDER_PRESETS`, a short name of :data:`SHORT_NAMES`, or a folder or Hub id whose
    ``config.json`` has a ``model_type`` of :data:`EMBEDDER_MODEL_TYPES`.

    Raises:
        CheckpointError: a Hub id whose config cannot be fetched; an unreadable local config.json.
    """
    from .config_budget import names_model_of_kind

    return names_model_of_kind(model, revision, EMBEDDER_PRESETS, SHORT_NAMES, EMBEDDER_MODEL_TYPES)


def load_embedder(model: str, revision: str | None = None):
    """Load the checkpoint: ``(model, processor or None, source, family, config_eps)``.

    CLIP: ``CLIPModel`` and its processor (the tokenizer). DINO: ``ViTModel`` without pooler with
    ``layer_norm_eps`` set to :data:`DINO_LAYER_NORM_EPS` (``config_eps``: the config.json value).
    DINOv2: ``Dinov2Model``. Eager attention everywhere (exportable, the reference's math).

    Raises:
        CheckpointError: the checkpoint cannot be loaded, or its model_type is not an embedder's.
    """
    from transformers import AutoConfig, AutoProcessor, CLIPModel, Dinov2Model, ViTModel

    path, source = checkpoint_source(model, revision, SHORT_NAMES)
    try:
        config = AutoConfig.from_pretrained(path, revision=revision)
        family = EMBEDDER_MODEL_TYPES.get(config.model_type)
        if family is None:
            raise CheckpointError(
                f"model_type {config.model_type!r} is not an embedder ({', '.join(EMBEDDER_MODEL_TYPES)})"
            )
        config_eps, processor = float(getattr(config, "layer_norm_eps", 0.0) or 0.0), None
        m: CLIPModel | ViTModel | Dinov2Model
        # transformers annotates ``revision`` as str; None is its own default (the main branch)
        if family == "clip":
            m = CLIPModel.from_pretrained(path, revision=revision, attn_implementation="eager")  # type: ignore[arg-type]
            processor = AutoProcessor.from_pretrained(path, revision=revision)
        elif family == "dino":
            config.layer_norm_eps = DINO_LAYER_NORM_EPS
            m = ViTModel.from_pretrained(
                path,
                revision=revision,  # type: ignore[arg-type]  # transformers says str; None is its default
                config=config,
                add_pooling_layer=False,
                attn_implementation="eager",
            )
        else:
            m = Dinov2Model.from_pretrained(path, revision=revision, attn_implementation="eager")  # type: ignore[arg-type]
    except OSError as e:
        raise CheckpointError(
            f"cannot load {model!r} as an embedder Hugging Face id or local checkpoint: "
            f"{' '.join(str(e).split())}; {OFFLINE_HINT}"
        ) from e
    m.eval()
    pin_revision(m, source)
    return m, processor, source, family, config_eps


def architecture(m, family: str, config_eps: float) -> dict:
    """The manifest's ``architecture`` section (widths, patch, input size, LayerNorm eps)."""
    vc = m.config.vision_config if family == "clip" else m.config
    arch = {
        "model_type": m.config.model_type,
        "vision_width": int(vc.hidden_size),
        "vision_layers": int(vc.num_hidden_layers),
        "patch_size": int(vc.patch_size),
        "config_image_size": int(vc.image_size),
        "input_size": 224,
        "layer_norm_eps": float(vc.layer_norm_eps),
    }
    if family == "dino":
        arch["config_layer_norm_eps"] = config_eps  # what config.json said (1e-12 on the Hub)
    if family == "clip":
        arch.update(
            text_width=int(m.config.text_config.hidden_size),
            text_layers=int(m.config.text_config.num_hidden_layers),
            projection_dim=int(m.config.projection_dim),
        )
    return arch


def export_embedder_bundle(
    model: str,
    out_dir: str | Path,
    revision: str | None = None,
    validate: bool = True,
    precision: str = "fp32",
    max_memory_gb: float | None = None,
    certify: str | None = None,
    cpu_precision_options: dict | None = None,
) -> Path:
    """Export the CLIP / DINO / DINOv2 checkpoint ``model`` to an embedder bundle and validate it.

    Staged beside ``out_dir`` and renamed into place only when every check passed, by
    export/exporter.py ``export_bundle``.

    Args:
        model: Hugging Face id, short name (:data:`SHORT_NAMES`), local checkpoint directory, or
            ``random:clip-tiny`` / ``random:clip-tiny-l14`` / ``random:dino-tiny-s16`` /
            ``random:dino-tiny-s8`` / ``random:dinov2-tiny`` (tests), or a preset of a real
            checkpoint's shape (``random:clip-b32``, ``random:clip-l14``, ``random:dino-s16``).
        out_dir: the bundle directory (absent, empty, or a bundle, which is replaced).
        revision: Hub revision to pin.
        validate: the post-export validation (export/embedders_validate.py).
        precision: ``fp32`` only (:data:`PRECISIONS`).
        max_memory_gb: the memory budget the config's shapes are checked against first
            (certification included with ``certify``).
        certify: None, or ``bf16-cpu``: the staged fp32 bundle certified for bf16 on OpenVINO's
            CPU plugin (export/cpu_precision.py ``certify_bundle``: its pairs' image-image and
            image-text cosines against fp32 ONNX Runtime), else refused with the figures.
        cpu_precision_options: keyword arguments of the certification (``calibration``,
            ``heldout``, ``graphs``, ``threads``, ``max_keep``).

    Raises:
        CheckpointError: the checkpoint cannot be loaded or is not an embedder.
        ExportMemoryError: the config's shapes do not fit the memory budget (nothing built).
        ExportValidationError: a graph disagrees with transformers beyond its budget; with
            ``certify``, the bf16 candidates fail their gates (``CertificationError``).
        BackendUnavailableError: ``certify`` without openvino or without native bf16 on this CPU.
        BundleError: ``out_dir`` is a non-empty directory that is not a bundle.
        ValueError: another precision.
    """
    from .exporter import export_bundle

    if precision not in PRECISIONS:
        raise ValueError(f"an embedder exports {' or '.join(PRECISIONS)} graphs, not {precision!r}")

    def into(stage, model_, _max_num_patches, revision_, validate_, _precision, *_scorer_options):
        export_embedder_into(stage, model_, revision_, validate_, max_memory_gb, plan=certify or "fp32")

    return export_bundle(
        model,
        out_dir,
        revision=revision,
        validate=validate,
        into=into,
        certify=certify,
        cpu_precision_options=cpu_precision_options,
    )


def export_embedder_into(
    out: Path,
    model: str,
    revision: str | None,
    validate: bool,
    max_memory_gb: float | None = None,
    plan: str = "fp32",
) -> None:
    """Write an embedder bundle into the (staging) directory ``out`` (see
    :func:`export_embedder_bundle`); ``plan``: the precision the memory plan covers (``bf16-cpu``:
    the certification after the export)."""
    from .config_budget import preflight

    preflight(model, revision, SHORT_NAMES, max_memory_gb, plan, fused=False)
    import torch

    from .embedders_graphs import graph_specs
    from .embedders_validate import validate_embedder
    from .exporter import _save_tokenizer, _versions, text_settings_from_processor
    from .graphs import export_graph
    from .onnx_check import check_graphs

    t0 = time.time()
    m, processor, source, family, config_eps = load_embedder(model, revision)
    recipe, rule = RECIPES[family]
    if family == "clip" and int(m.config.vision_config.patch_size) == 14:
        recipe = {**recipe, "follows": CLIP_L14_FOLLOWS}
    text = None
    if family == "clip":
        text = text_settings_from_processor(m, processor)
        text["pooling"] = clip_pooling_rule(int(m.config.text_config.eos_token_id))
        text["eos_token_id"] = int(m.config.text_config.eos_token_id)
        _save_tokenizer(processor, out / text["tokenizer_file"])
    specs = graph_specs(m, family, text)
    torch.set_grad_enabled(False)
    for spec in specs:
        t = time.time()
        export_graph(spec, out / spec.file, opset=OPSET)
        logger.info(f"exported {spec.name} -> {spec.file} ({time.time() - t:.1f}s)")
    graphs = {s.name: s.manifest_entry() for s in specs}
    dim = int(specs[0].outputs[0].shape[-1])
    manifest = {
        "kind": KIND,
        "family": family,
        "source": source,
        "architecture": architecture(m, family, config_eps),
        "recipe": dict(recipe),
        "embedding": {"image": rule, "text": TEXT_RULES[0] if text else None, "dim": dim, "normalized": False},
        "graphs": graphs,
        "validation": {},
        "precision": {"mode": "fp32"},
        "transforms": [],
        "variants": {},
        "versions": _versions(),
        "files": ([text["tokenizer_file"]] if text else []) + [e["file"] for e in graphs.values()],
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if text:
        manifest["text"] = text
    if validate:
        manifest["validation"] = validate_embedder(out, graphs, m, processor, family, text, source)
    manifest["export_seconds"] = round(time.time() - t0, 1)
    manifest["onnx_checker"] = {"full_check": True, "graphs": check_graphs(out, manifest["files"])}
    write_manifest(out, manifest)
