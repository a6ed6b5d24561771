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
precision graphs (``--precision fp16``/``bf16``) come from export/precision.py's transform and
policy, checked with the reduced-precision gates. The manifest records the mask recipe
(runtime/segmenter.py :class:`~masc_engine.runtime.segmenter.MaskRecipe`) with its defaults.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from torch import nn

from ..engine.manifest import write_manifest
from ..runtime.segmenter import KIND, MaskRecipe
from .exporter import (_PIL_NAMES, CheckpointError, _save_tokenizer, _versions, random_checkpoint_dir,
                       text_settings_from_processor)
from .graphs import GraphSpec, TensorSpec, export_graph
from .random_models import SEGMENTER_PRESETS, is_random_model_id

OPSET = 18
#: Model types exported as segmenters (``config.model_type``).
SEGMENTER_MODEL_TYPES = ("clipseg",)
#: Short names accepted by ``--model``.
SHORT_NAMES = {"clipseg": "CIDAS/clipseg-rd64-refined", "clipseg-rd64-refined": "CIDAS/clipseg-rd64-refined"}
#: The bundle's graphs, in run order.
GRAPHS = ("vision", "text", "decoder")


def is_segmenter_model(model: str, revision: str | None = None) -> bool:
    """Whether ``model`` (a ``--model`` value) names a segmenter checkpoint.

    ``random:<preset>``: by the preset name; a short name by its table; a local directory by its
    ``config.json``'s ``model_type``; a Hub id by its config (fetched by transformers, a few kB;
    an id that cannot be fetched is left to the SigLIP2 exporter, which reports the error).
    """
    if is_random_model_id(model):
        return model.split(":", 1)[1] in SEGMENTER_PRESETS
    if model in SHORT_NAMES:
        return True
    path = Path(model)
    if path.is_dir():
        try:
            return json.loads((path / "config.json").read_text()).get("model_type") in SEGMENTER_MODEL_TYPES
        except (OSError, ValueError):
            return False
    try:
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(model, revision=revision).model_type in SEGMENTER_MODEL_TYPES
    except Exception:  # noqa: BLE001 - any failure: not recognisably a segmenter
        return False


def load_segmenter(model: str, revision: str | None = None):
    """Load ``CLIPSegForImageSegmentation`` and its processor: ``(model, processor, source)``.

    Raises:
        CheckpointError: the checkpoint cannot be loaded or is not CLIPSeg.
    """
    from transformers import AutoProcessor, CLIPSegForImageSegmentation

    source = {"model": model, "revision": revision, "random_weights": False}
    path = model
    if is_random_model_id(model):
        path = str(random_checkpoint_dir(model))
        source.update(random_weights=True, preset=model.split(":", 1)[1], checkpoint_dir=path)
    else:
        source["model"] = path = SHORT_NAMES.get(model, model)
    try:
        m = CLIPSegForImageSegmentation.from_pretrained(path, revision=revision, attn_implementation="eager")
        processor = AutoProcessor.from_pretrained(path, revision=revision)
    except OSError as e:
        raise CheckpointError(f"cannot load {model!r} as a CLIPSeg Hugging Face id or local checkpoint: {e}") from e
    if m.config.model_type not in SEGMENTER_MODEL_TYPES:
        raise CheckpointError(f"model_type {m.config.model_type!r} is not a segmenter ({SEGMENTER_MODEL_TYPES})")
    m.eval()
    commit = getattr(m.config, "_commit_hash", None)
    if commit and not source.get("revision"):
        source["revision"] = commit
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
        h, w = (int(ip.size), int(ip.size)) if isinstance(ip.size, int) else (int(ip.size["height"]),
                                                                             int(ip.size["width"]))
    except (KeyError, TypeError):
        h = w = 0
    if not ip.do_resize or h != w or h % patch:
        raise CheckpointError(f"the segmenter needs a square resize to a multiple of the patch size {patch}; "
                              f"the processor has do_resize={ip.do_resize}, size={ip.size}")
    if not (ip.do_rescale and ip.do_normalize):
        raise CheckpointError("image processors without rescale+normalize are not supported")
    resample = getattr(ip.resample, "value", ip.resample)
    return dict(mode="fixed", image_size=[h, w], patch_size=patch, max_num_patches=(h // patch) ** 2,
                position_grid=None, resample=_PIL_NAMES[int(resample)], rescale_factor=float(ip.rescale_factor),
                image_mean=[float(x) for x in ip.image_mean], image_std=[float(x) for x in ip.image_std],
                do_resize=True, do_rescale=True, do_normalize=True, image_processor=type(ip).__name__)


def text_settings(model, processor) -> dict:
    """The manifest's ``text`` section: the SigLIP2 exporter's reading of the tokenizer
    (export/exporter.py ``text_settings_from_processor``), padding to ``max_length`` (77)."""
    text = text_settings_from_processor(model.clip, processor)
    text["text_tower_attention_mask"] = False  # causal tower: padding after end-of-text is inert
    text["pooling"] = ("argmax of input_ids (legacy eos_token_id 2)" if model.config.text_config.eos_token_id == 2
                       else "first eos_token_id")
    return text


class CLIPSegVisionSide(nn.Module):
    """``pixel_values [B, 3, S, S]`` -> ``activations [B, K, T, D]``: CLIPSegVisionEmbeddings
    (interpolated position embeddings as a constant), ``pre_layrnorm``, encoder layers up to the
    last of ``extract_layers``, stacking the outputs of those layers.

    Same computation as transformers 5.24.0 ``CLIPSegForImageSegmentation.forward`` step 1
    (``hidden_states[i + 1] for i in extract_layers``).
    """

    def __init__(self, model: nn.Module, image_size: int):
        super().__init__()
        vm = model.clip.vision_model
        self.vm = vm
        self.extract = [int(i) for i in model.extract_layers]
        emb = vm.embeddings
        tokens = 1 + (image_size // emb.patch_size) ** 2
        with torch.no_grad():
            pos = emb.interpolate_pos_encoding(torch.zeros(1, tokens, emb.embed_dim), image_size, image_size)
        self.register_buffer("position_embeddings", pos.detach().clone(), persistent=False)

    def forward(self, pixel_values):
        emb = self.vm.embeddings
        x = emb.patch_embedding(pixel_values).flatten(2).transpose(1, 2)
        cls = emb.class_embedding.expand(x.shape[0], 1, -1)
        x = torch.cat([cls, x], dim=1) + self.position_embeddings
        x = self.vm.pre_layrnorm(x)
        outs = []
        for i, layer in enumerate(self.vm.encoder.layers[: max(self.extract) + 1]):
            x = layer(x, None)
            if i in self.extract:
                outs.append(x)
        return torch.stack(outs, dim=1)


class CLIPSegTextSide(nn.Module):
    """``input_ids [B, L]`` -> ``conditional_embeddings [B, P]`` (``clip.get_text_features``)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.clip = model.clip

    def forward(self, input_ids):
        return self.clip.get_text_features(input_ids=input_ids).pooler_output


class CLIPSegDecoderSide(nn.Module):
    """``activations [B, K, T, D]``, ``conditional_embeddings [B, P]`` -> ``logits [B, S, S]``
    (``CLIPSegDecoder`` on the activations in ``extract_layers`` order)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.decoder = model.decoder
        self.k = len(model.extract_layers)

    def forward(self, activations, conditional_embeddings):
        hidden = tuple(activations[:, i] for i in range(self.k))
        return self.decoder(hidden, conditional_embeddings).logits


def graph_specs(model, image: dict, text: dict) -> list[GraphSpec]:
    """The three graphs' specs (export/graphs.py), traced at batch 2."""
    s = int(image["image_size"][0])
    d = int(model.config.vision_config.hidden_size)
    k = len(model.extract_layers)
    t = 1 + (s // int(image["patch_size"])) ** 2
    p = int(model.config.projection_dim)
    length = int(text["max_length"])
    vocab = int(model.config.text_config.vocab_size)
    g = lambda seed: torch.Generator().manual_seed(seed)  # noqa: E731
    return [
        GraphSpec("vision", "vision.onnx", [TensorSpec("pixel_values", "float32", ("batch", 3, s, s))],
                  [TensorSpec("activations", "float32", ("batch", k, t, d))],
                  CLIPSegVisionSide(model, s).eval(), lambda: (torch.randn(2, 3, s, s, generator=g(0)),),
                  extra={"extract_layers": [int(i) for i in model.extract_layers]}),
        GraphSpec("text", "text.onnx", [TensorSpec("input_ids", "int64", ("batch", length))],
                  [TensorSpec("conditional_embeddings", "float32", ("batch", p))],
                  CLIPSegTextSide(model).eval(), lambda: (torch.randint(0, vocab, (2, length), generator=g(1)),)),
        GraphSpec("decoder", "decoder.onnx",
                  [TensorSpec("activations", "float32", ("batch", k, t, d)),
                   TensorSpec("conditional_embeddings", "float32", ("batch", p))],
                  [TensorSpec("logits", "float32", ("batch", s, s))],
                  CLIPSegDecoderSide(model).eval(),
                  lambda: (torch.randn(2, k, t, d, generator=g(2)), torch.randn(2, p, generator=g(3)))),
    ]


def architecture(model) -> dict:
    c = model.config
    return {"model_type": c.model_type, "vision_width": int(c.vision_config.hidden_size),
            "vision_layers": int(c.vision_config.num_hidden_layers),
            "vision_layers_in_graph": max(int(i) for i in c.extract_layers) + 1,
            "extract_layers": [int(i) for i in c.extract_layers], "patch_size": int(c.vision_config.patch_size),
            "position_grid": int(c.vision_config.image_size) // int(c.vision_config.patch_size),
            "text_width": int(c.text_config.hidden_size), "text_layers": int(c.text_config.num_hidden_layers),
            "projection_dim": int(c.projection_dim), "reduce_dim": int(c.reduce_dim),
            "conditional_layer": int(c.conditional_layer),
            "complex_transposed_convolution": bool(c.use_complex_transposed_convolution)}


def export_segmenter_bundle(model: str, out_dir: str | Path, revision: str | None = None, validate: bool = True,
                            log=print, precision: str = "fp32") -> Path:
    """Export the CLIPSeg checkpoint ``model`` to a segmenter bundle in ``out_dir`` and validate it.

    Staged beside ``out_dir`` and renamed into place only when every check passed, by
    export/exporter.py ``export_bundle`` (same precision checks, same staging).

    Args:
        model: Hugging Face id (``CIDAS/clipseg-rd64-refined``), short name (``clipseg``), local
            checkpoint directory, or ``random:clipseg-tiny`` / ``random:clipseg-rd64``.
        out_dir: the bundle directory (absent, empty, or a bundle, which is replaced).
        revision: Hub revision to pin.
        validate: the post-export validation (required for fp16 / bf16).
        precision: ``fp32``, or ``fp16`` / ``bf16`` (export/precision.py's transform and policy).

    Raises:
        CheckpointError: the checkpoint cannot be loaded, is not CLIPSeg, or its processor is
            unsupported.
        ExportValidationError: a graph disagrees with transformers beyond its budget (fp32) or its
            reduced-precision gates (fp16 / bf16); nothing is left at ``out_dir``.
        BundleError: ``out_dir`` is a non-empty directory that is not a bundle.
        ValueError: another precision (``bf16-cpu``, ``int8``: the scorer's).
    """
    from .exporter import export_bundle

    if precision not in ("fp32", "fp16", "bf16"):  # bf16-cpu certifies the scorer's pairs; int8 is the scorer's
        raise ValueError(f"a segmenter exports fp32, fp16 or bf16, not {precision!r}")

    def into(stage, model_, _max_num_patches, revision_, validate_, log_, precision_, *_scorer_options):
        export_segmenter_into(stage, model_, revision_, validate_, log_, precision_)

    return export_bundle(model, out_dir, revision=revision, validate=validate, log=log, precision=precision,
                         into=into)


def export_segmenter_into(out: Path, model: str, revision: str | None, validate: bool, log,
                          precision: str = "fp32") -> None:
    """Write a segmenter bundle into the (staging) directory ``out`` (see
    :func:`export_segmenter_bundle`, which stages, renames into place and cleans up)."""
    from . import segmenter_validate as val

    t0 = time.time()
    m, processor, source = load_segmenter(model, revision)
    image, text = image_settings(m, processor), text_settings(m, processor)
    _save_tokenizer(processor, out / text["tokenizer_file"])
    specs = graph_specs(m, image, text)
    torch.set_grad_enabled(False)
    for spec in specs:
        t = time.time()
        export_graph(spec, out / spec.file, opset=OPSET)
        log(f"exported {spec.name} -> {spec.file} ({time.time() - t:.1f}s)")
    graphs = {s.name: s.manifest_entry() for s in specs}
    manifest = {
        "kind": KIND, "source": source, "architecture": architecture(m), "image": image, "text": text,
        "recipe": MaskRecipe().to_manifest(), "graphs": graphs, "validation": {},
        "precision": {"mode": "fp32"}, "transforms": [], "variants": {}, "versions": _versions(),
        "files": [text["tokenizer_file"]] + [e["file"] for e in graphs.values()],
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    write_manifest(out, manifest)  # provisional: the end-to-end check runs the runtime Segmenter on it
    if validate:
        manifest["validation"] = val.validate_segmenter(out, graphs, m, processor, image, text, log=log)
    if precision != "fp32":
        manifest["transforms"], manifest["precision"] = _reduce_precision(out, manifest, m, processor, precision,
                                                                          validate, log)
    manifest["export_seconds"] = round(time.time() - t0, 1)
    write_manifest(out, manifest)


def _reduce_precision(out: Path, manifest: dict, m, processor, precision: str, validate: bool,
                      log) -> tuple[list, dict]:
    """export/precision.py's fp16 / bf16 transform on the three graphs, each result validated with
    the reduced-precision gates (export/segmenter_validate.py), then the masks end to end; returns
    the manifest's ``transforms`` and ``precision`` sections."""
    from . import segmenter_validate as val
    from .precision import PrecisionTransform, policy
    from .transforms import run_transforms

    transform = PrecisionTransform(precision)
    transform.graphs = GRAPHS  # the policy's own graph list names the scorer's graphs
    image, text = manifest["image"], manifest["text"]
    check = ((lambda g, path, gates: val.validate_graph(g, path, out, m, processor, image, text, gates))
             if validate else (lambda g, path, gates: {"skipped": True}))
    records = run_transforms(out, manifest["graphs"], [transform], check, log=log)
    section = {"mode": precision, "graphs": list(GRAPHS), "policy": policy(),
               "validated_on": "ONNX Runtime CPU" + (", bf16 emulated (export/precision.py emulate_bf16)"
                                                     if precision == "bf16" else "")}
    if validate:
        write_manifest(out, {**manifest, "precision": section, "transforms": records})
        section["masks"] = val.validate_reduced_masks(out, m, processor, precision)
        log(f"{precision} masks: min IoU {section['masks']['min_iou']:.4f} against transformers fp32")
    return records, section
