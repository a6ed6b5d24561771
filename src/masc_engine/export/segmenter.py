"""``masc-export`` for a segmenter: a CLIPSeg checkpoint -> a validated bundle of kind ``segmenter``.

CLIPSeg (Lüddecke & Ecker, CVPR 2022; transformers ``CLIPSegForImageSegmentation``) predicts a
mask from an image and a text prompt: a frozen CLIP ViT reads the image, the CLIP text tower
embeds the prompt (the *conditional embedding*), and a light decoder mixes the activations of a
few vision layers (``config.extract_layers``) with that embedding (FiLM) into ``[S, S]`` logits.
The bundle splits it where the work is shared (docs/segmenter.md "Graphs"):

- ``vision``: ``pixel_values [B, 3, S, S] f32`` -> ``activations [B, K, T, D] f32``: the outputs
  of vision layers ``extract_layers`` (``K`` of them; ``T = 1 + (S / patch)**2`` tokens, class token
  first). Run once per image. Layers after the last extracted one are not in the graph (their
  output is never read by the decoder): 10 of the real checkpoint's 12 layers run.
- ``text``: ``input_ids [B, L] i64`` (``L`` = 77, padded on the right) -> ``conditional_embeddings
  [B, P] f32`` (``get_text_features``: the text tower's pooled token, projected). Run once per
  distinct prompt; no attention mask: the tower is causal, so tokens after the end-of-text token
  (the padding) cannot change its pooled state.
- ``decoder``: ``activations [B, K, T, D]``, ``conditional_embeddings [B, P]`` -> ``logits [B, S, S]``.
  Run once per (image, prompt).

The position embeddings, interpolated (bicubic) from the trained grid to ``S / patch`` as
transformers does for every input whose grid differs, are computed by PyTorch at export and stored
as a constant of the vision graph: the graph's input size is fixed by the processor (352 x 352 for
CIDAS/clipseg-rd64-refined), and TensorRT needs no Resize.

:func:`export_segmenter_bundle` is the entry point (``masc-export`` calls it for CLIPSeg
checkpoints); export/exporter.py ``export_bundle`` stages and renames the bundle. Every graph is
validated against transformers right after export (export/segmenter_validate.py)
on batch sizes other than the traced one and images of other sizes and aspect ratios; reduced
precision graphs (``--precision fp16``) come from export/precision.py's transform and
policy, checked with the reduced-precision gates. The manifest records the mask recipe
(runtime/segmenter.py :class:`~masc_engine.runtime.segmenter.MaskRecipe`) with its defaults.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from ..engine.manifest import write_manifest
from ..runtime.segmenter import KIND, MaskRecipe
from ..runtime.text import clip_pooling_rule
from .exporter import _PIL_NAMES, CheckpointError, _save_tokenizer, _versions, text_settings_from_processor
from .checkpoint import OFFLINE_HINT, checkpoint_source, pin_revision
from .onnx_check import check_graphs
from .random_models import SEGMENTER_PRESETS

logger = logging.getLogger(__name__)

OPSET = 18
#: Model types exported as segmenters (``config.model_type``).
SEGMENTER_MODEL_TYPES = ("clipseg",)
#: Short names accepted by ``--model``.
SHORT_NAMES = {"clipseg": "CIDAS/clipseg-rd64-refined", "clipseg-rd64-refined": "CIDAS/clipseg-rd64-refined"}
#: The bundle's graphs, in run order.
GRAPHS = ("vision", "text", "decoder")
#: Graph precisions a segmenter exports. Not bf16: ONNX's Conv (the patch embedding, the decoder's
#: convolutions) has no bfloat16 type before opset 22, so the bf16 graphs fail onnx.checker's
#: full check at the bundle's opset 18 (bf16-cpu and int8 are the scorer's CPU options).
PRECISIONS = ("fp32", "fp16")


def is_segmenter_model(model: str, revision: str | None = None) -> bool:
    """Whether ``model`` (a ``--model`` value) names a segmenter checkpoint.

    ``random:<preset>``: by the preset name; a short name (the segmenter's or the scorer's) by its
    table, with no network call; a local directory by its ``config.json``'s ``model_type``; a Hub
    id by its ``config.json`` (export/config_budget.py :func:`~.config_budget.hub_config`: one
    request without retries, the local cache only under ``HF_HUB_OFFLINE``).

    Raises:
        CheckpointError: a Hub id whose config cannot be fetched (one line; offline, it names
            ``--model /local/folder``); a local folder whose config.json is unreadable, over 4 MiB,
            not JSON or not a JSON object (export/config_budget.py :func:`~.config_budget.read_config_json`).
    """
    from .config_budget import names_model_of_kind

    return names_model_of_kind(model, revision, SEGMENTER_PRESETS, SHORT_NAMES, SEGMENTER_MODEL_TYPES)


def load_segmenter(model: str, revision: str | None = None):
    """Load ``CLIPSegForImageSegmentation`` and its processor: ``(model, processor, source)``.

    Raises:
        CheckpointError: the checkpoint cannot be loaded or is not CLIPSeg.
    """
    from transformers import AutoProcessor, CLIPSegForImageSegmentation

    path, source = checkpoint_source(model, revision, SHORT_NAMES)
    try:
        m = CLIPSegForImageSegmentation.from_pretrained(
            path,
            revision=revision,  # type: ignore[arg-type]  # transformers says str; None is its default
            attn_implementation="eager",
        )
        processor = AutoProcessor.from_pretrained(path, revision=revision)
    except OSError as e:
        raise CheckpointError(
            f"cannot load {model!r} as a CLIPSeg Hugging Face id or local checkpoint: {e}; {OFFLINE_HINT}"
        ) from e
    if m.config.model_type not in SEGMENTER_MODEL_TYPES:
        raise CheckpointError(f"model_type {m.config.model_type!r} is not a segmenter ({SEGMENTER_MODEL_TYPES})")
    m.eval()
    pin_revision(m, source)
    return m, processor, source


def image_settings(model, processor) -> dict:
    """The manifest's ``image`` section, read from the checkpoint's image processor.

    The schema of a fixed-size SigLIP bundle's (runtime/preprocess.py ``ImageSettings``: ``mode``
    ``fixed``): resize to ``image_size`` with ``resample``, rescale, normalize.

    Raises:
        CheckpointError: the processor does not resize to a square (the decoder reshapes its tokens
            to a square grid), does not rescale and normalize, or the size is not a multiple of the
            patch size.
    """
    ip = processor.image_processor
    patch = int(model.config.vision_config.patch_size)
    try:  # transformers' SizeDict; {"height", "width"} for a fixed-size resize
        h, w = (
            (int(ip.size), int(ip.size))
            if isinstance(ip.size, int)
            else (int(ip.size["height"]), int(ip.size["width"]))
        )
    except (KeyError, TypeError):
        h = w = 0
    if not ip.do_resize or h != w or h % patch:
        raise CheckpointError(
            f"the segmenter needs a square resize to a multiple of the patch size {patch}; "
            f"the processor has do_resize={ip.do_resize}, size={ip.size}"
        )
    if not (ip.do_rescale and ip.do_normalize):
        raise CheckpointError("image processors without rescale+normalize are not supported")
    resample = getattr(ip.resample, "value", ip.resample)
    return dict(
        mode="fixed",
        image_size=[h, w],
        patch_size=patch,
        max_num_patches=(h // patch) ** 2,
        position_grid=None,
        resample=_PIL_NAMES[int(resample)],
        rescale_factor=float(ip.rescale_factor),
        image_mean=[float(x) for x in ip.image_mean],
        image_std=[float(x) for x in ip.image_std],
        do_resize=True,
        do_rescale=True,
        do_normalize=True,
        image_processor=type(ip).__name__,
    )


def text_settings(model, processor) -> dict:
    """The manifest's ``text`` section: the SigLIP2 exporter's reading of the tokenizer
    (export/exporter.py ``text_settings_from_processor``), padding to ``max_length`` (77)."""
    text = text_settings_from_processor(model.clip, processor)
    text["text_tower_attention_mask"] = False  # causal tower: padding after end-of-text is inert
    text["pooling"] = clip_pooling_rule(int(model.config.text_config.eos_token_id))
    return text


def architecture(model) -> dict:
    c = model.config
    return {
        "model_type": c.model_type,
        "vision_width": int(c.vision_config.hidden_size),
        "vision_layers": int(c.vision_config.num_hidden_layers),
        "vision_layers_in_graph": max(int(i) for i in c.extract_layers) + 1,
        "extract_layers": [int(i) for i in c.extract_layers],
        "patch_size": int(c.vision_config.patch_size),
        "position_grid": int(c.vision_config.image_size) // int(c.vision_config.patch_size),
        "text_width": int(c.text_config.hidden_size),
        "text_layers": int(c.text_config.num_hidden_layers),
        "projection_dim": int(c.projection_dim),
        "reduce_dim": int(c.reduce_dim),
        "conditional_layer": int(c.conditional_layer),
        "complex_transposed_convolution": bool(c.use_complex_transposed_convolution),
    }


def export_segmenter_bundle(
    model: str,
    out_dir: str | Path,
    revision: str | None = None,
    validate: bool = True,
    precision: str = "fp32",
    max_memory_gb: float | None = None,
) -> Path:
    """Export the CLIPSeg checkpoint ``model`` to a segmenter bundle in ``out_dir`` and validate it.

    Staged beside ``out_dir`` and renamed into place only when every check passed, by
    export/exporter.py ``export_bundle`` (same precision checks, same staging).

    Args:
        model: Hugging Face id (``CIDAS/clipseg-rd64-refined``), short name (``clipseg``), local
            checkpoint directory, or ``random:clipseg-tiny`` / ``random:clipseg-rd64``.
        out_dir: the bundle directory (absent, empty, or a bundle, which is replaced).
        revision: Hub revision to pin.
        validate: the post-export validation (required for fp16).
        precision: ``fp32`` or ``fp16`` (export/precision.py's transform and policy); see
            :data:`PRECISIONS`.
        max_memory_gb: the memory budget the config's shapes are checked against before the
            model is built (export/config_budget.py; default: this machine's or container's).

    Raises:
        CheckpointError: the checkpoint cannot be loaded, is not CLIPSeg, or its processor is
            unsupported.
        ExportMemoryError: the config's shapes do not fit the memory budget (nothing built).
        ExportValidationError: a graph disagrees with transformers beyond its budget (fp32) or its
            reduced-precision gates (fp16); nothing is left at ``out_dir``.
        BundleError: ``out_dir`` is a non-empty directory that is not a bundle.
        ValueError: another precision (:data:`PRECISIONS`).
    """
    from .exporter import export_bundle

    if precision not in PRECISIONS:
        raise ValueError(f"a segmenter exports {' or '.join(PRECISIONS)} graphs, not {precision!r}")

    def into(stage, model_, _max_num_patches, revision_, validate_, precision_, *_scorer_options):
        export_segmenter_into(stage, model_, revision_, validate_, precision_, max_memory_gb)

    return export_bundle(model, out_dir, revision=revision, validate=validate, precision=precision, into=into)


def export_segmenter_into(
    out: Path,
    model: str,
    revision: str | None,
    validate: bool,
    precision: str = "fp32",
    max_memory_gb: float | None = None,
) -> None:
    """Write a segmenter bundle into the (staging) directory ``out`` (see
    :func:`export_segmenter_bundle`, which stages, renames into place and cleans up)."""
    from .config_budget import preflight

    # the config's shapes against the budget before transformers builds a layer
    preflight(model, revision, SHORT_NAMES, max_memory_gb, precision, fused=False)
    import torch

    from . import segmenter_validate as val
    from .graphs import export_graph
    from .segmenter_graphs import graph_specs

    t0 = time.time()
    m, processor, source = load_segmenter(model, revision)
    image, text = image_settings(m, processor), text_settings(m, processor)
    _save_tokenizer(processor, out / text["tokenizer_file"])
    specs = graph_specs(m, image, text)
    torch.set_grad_enabled(False)
    for spec in specs:
        t = time.time()
        export_graph(spec, out / spec.file, opset=OPSET)
        logger.info(f"exported {spec.name} -> {spec.file} ({time.time() - t:.1f}s)")
    graphs = {s.name: s.manifest_entry() for s in specs}
    manifest = {
        "kind": KIND,
        "source": source,
        "architecture": architecture(m),
        "image": image,
        "text": text,
        "recipe": MaskRecipe().to_manifest(),
        "graphs": graphs,
        "validation": {},
        "precision": {"mode": "fp32"},
        "transforms": [],
        "variants": {},
        "versions": _versions(),
        "files": [text["tokenizer_file"]] + [e["file"] for e in graphs.values()],
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    write_manifest(out, manifest)  # provisional: the end-to-end check runs the runtime Segmenter on it
    if validate:
        manifest["validation"] = val.validate_segmenter(out, graphs, m, processor, image, text)
    if precision != "fp32":
        manifest["transforms"], manifest["precision"] = _reduce_precision(
            out, manifest, m, processor, precision, validate
        )
    manifest["export_seconds"] = round(time.time() - t0, 1)
    # every graph passes the ONNX checker (full_check), or no bundle: as the scorer's export
    manifest["onnx_checker"] = {"full_check": True, "graphs": check_graphs(out, manifest["files"])}
    write_manifest(out, manifest)


def _reduce_precision(out: Path, manifest: dict, m, processor, precision: str, validate: bool) -> tuple[list, dict]:
    """export/precision.py's fp16 transform on the three graphs, each result validated with
    the reduced-precision gates (export/segmenter_validate.py), then the masks end to end; returns
    the manifest's ``transforms`` and ``precision`` sections."""
    from . import segmenter_validate as val
    from .precision import PrecisionTransform, policy
    from .transforms import run_transforms

    transform = PrecisionTransform(precision)
    transform.graphs = GRAPHS  # the policy's own graph list names the scorer's graphs
    image, text = manifest["image"], manifest["text"]
    check = (
        (lambda g, path, gates: val.validate_graph(g, path, out, m, processor, image, text, gates))
        if validate
        else (lambda g, path, gates: {"skipped": True})
    )
    records = run_transforms(out, manifest["graphs"], [transform], check)
    section = {"mode": precision, "graphs": list(GRAPHS), "policy": policy(), "validated_on": "ONNX Runtime CPU"}
    if validate:
        write_manifest(out, {**manifest, "precision": section, "transforms": records})
        section["masks"] = masks = val.validate_reduced_masks(out, m, processor, precision)
        logger.info(f"{precision} masks: min IoU {masks['min_iou']:.4f} against transformers fp32")
    return records, section
