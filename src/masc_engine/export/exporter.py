"""``masc-export``: a SigLIP2 checkpoint -> a validated bundle (ONNX graphs, tokenizer, manifest).

Steps (optimum-style): load the checkpoint and its processor; read every preprocessing and text
setting from the processor objects into the manifest; export each graph from its spec
(export/graphs.py); validate each graph against PyTorch right away on batch sizes and patch
grids other than the traced ones (export/validate.py), raising :class:`ExportValidationError`
past its per-shape budget (``tolerances.EXPORT_VALIDATION_BUDGETS``); run the graph-transform
pipeline (export/transforms.py: mixed precision, and for fp32 bundles the fused ``ort-cpu``
variant of the vision and text graphs, export/fusion.py), validating each result the same way
(the fused graphs also on CP and PF, within ``tolerances.ORACLE_SCORE_ATOL``); write
``manifest.json`` with every file's sha256.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import time
from pathlib import Path

from typing import Sequence

from ..errors import BundleError, MascEngineError
from ..engine.manifest import write_manifest
from ..runtime.masks import DEFAULT_FG_THRESHOLD
from .random_models import build_random_checkpoint, is_random_model_id, preset_names

DEFAULT_MODEL = "google/siglip2-so400m-patch16-naflex"
#: Short names accepted by ``--model``.
SHORT_NAMES = {
    "siglip2-so400m": "google/siglip2-so400m-patch16-naflex",
    "siglip2-base": "google/siglip2-base-patch16-naflex",
    "siglip2-base-512": "google/siglip2-base-patch16-512",
}
#: The paper's patch budget (masc-metric 0.3.0 ``DEFAULT_NAFLEX_MAX_PATCHES``).
DEFAULT_MAX_NUM_PATCHES = 1024
OPSET = 18

_PIL_NAMES = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}


class CheckpointError(MascEngineError):
    """The checkpoint cannot be loaded (unknown id, gated, not SigLIP2)."""


def random_checkpoint_dir(name: str) -> Path:
    """Local directory of a built-in random-weight checkpoint, built on first use.

    Cached under ``$MASC_ENGINE_CACHE`` (default ``~/.cache/masc-engine``) per transformers and
    torch version, since the random draw depends on both. The directory name keeps ``naflex`` in
    it for NaFlex presets: masc-metric 0.3.0 decides NaFlex from ``"naflex" in model_id``, and the
    oracle tests load the same directory.
    """
    import torch
    import transformers

    key = name.split(":", 1)[-1]
    if key not in preset_names():
        raise CheckpointError(f"unknown random model {name!r}; known: {', '.join('random:' + k for k in preset_names())}")
    root = Path(os.environ.get("MASC_ENGINE_CACHE", Path.home() / ".cache" / "masc-engine"))
    d = root / "random-models" / f"{key}-tf{transformers.__version__}-torch{torch.__version__.split('+')[0]}"
    if not (d / "masc_random_model.json").is_file():
        tmp = d.with_name(d.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        build_random_checkpoint(key, tmp)
        if not d.exists():
            tmp.rename(d)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return d


def _load(model: str, revision: str | None):
    """Load model + processor; return (model, processor, source dict)."""
    from transformers import AutoModel, AutoProcessor

    source = {"model": model, "revision": revision, "random_weights": False}
    path = model
    if is_random_model_id(model):
        path = str(random_checkpoint_dir(model))
        source.update(random_weights=True, preset=model.split(":", 1)[1], checkpoint_dir=path)
    else:
        model = SHORT_NAMES.get(model, model)
        source["model"] = path = model
    try:
        m = AutoModel.from_pretrained(path, revision=revision, attn_implementation="eager")
        processor = AutoProcessor.from_pretrained(path, revision=revision)
    except OSError as e:
        text = str(e)
        if "gated" in text.lower() or "401" in text or "403" in text:
            raise CheckpointError(
                f"{model} is a gated model: accept its licence on its Hugging Face page, then run "
                "`huggingface-cli login` (or set HF_TOKEN) and export again. Original error: " + text
            ) from e
        raise CheckpointError(f"cannot load {model!r} as a Hugging Face id or local checkpoint: {text}") from e
    m.eval()
    commit = getattr(m.config, "_commit_hash", None)
    if commit and not source.get("revision"):
        source["revision"] = commit
    return m, processor, source


def image_settings_from_processor(model, processor, max_num_patches: int | None) -> dict:
    """The manifest's ``image`` section, read from the loaded processor and config."""
    ip = processor.image_processor
    vcfg = model.config.vision_config
    family = model.config.model_type
    resample = ip.resample
    resample = _PIL_NAMES[int(getattr(resample, "value", resample))]
    common = dict(
        patch_size=int(vcfg.patch_size), resample=resample, rescale_factor=float(ip.rescale_factor),
        image_mean=[float(x) for x in ip.image_mean], image_std=[float(x) for x in ip.image_std],
        do_rescale=bool(ip.do_rescale), do_normalize=bool(ip.do_normalize),
        image_processor=type(ip).__name__,
    )
    if not (common["do_rescale"] and common["do_normalize"]):
        raise CheckpointError("image processors without rescale+normalize are not supported")
    if family == "siglip2":
        budget = int(max_num_patches or DEFAULT_MAX_NUM_PATCHES)
        return dict(mode="naflex", max_num_patches=budget, image_size=None,
                    position_grid=int(round(vcfg.num_patches ** 0.5)), **common)
    if family == "siglip":
        if max_num_patches:
            raise CheckpointError("--max-num-patches applies to NaFlex checkpoints only")
        size = ip.size
        h, w = int(size["height"]), int(size["width"])
        n = (h // vcfg.patch_size) * (w // vcfg.patch_size)
        return dict(mode="fixed", max_num_patches=n, image_size=[h, w], position_grid=None, **common)
    raise CheckpointError(f"model_type {family!r} is not a SigLIP2 checkpoint (siglip2 or siglip)")


def text_settings_from_processor(model, processor) -> dict:
    """The manifest's ``text`` section: what transformers applies on top of tokenizer.json."""
    tok = processor.tokenizer
    defaults = dict(getattr(type(processor), "text_kwargs", {}) or {})
    max_pos = int(model.config.text_config.max_position_embeddings)
    max_length = int(defaults.get("max_length") or min(int(tok.model_max_length), max_pos))
    return dict(
        tokenizer_file="tokenizer.json", max_length=max_length, padding="max_length",
        padding_side=tok.padding_side, truncation_side=tok.truncation_side,
        pad_token=str(tok.pad_token), pad_token_id=int(tok.pad_token_id),
        special_tokens={k: str(v) for k, v in tok.special_tokens_map.items()},
        special_token_ids={str(t): int(tok.convert_tokens_to_ids(t)) for t in tok.all_special_tokens},
        lowercase=tok("ABC", add_special_tokens=False)["input_ids"] == tok("abc", add_special_tokens=False)["input_ids"],
        reference_truncates=bool(defaults.get("truncation", False)),
        text_tower_attention_mask=False, tokenizer_class=type(tok).__name__,
    )


def _save_tokenizer(processor, path: Path) -> None:
    backend = processor.tokenizer.backend_tokenizer
    from tokenizers import Tokenizer

    clone = Tokenizer.from_str(backend.to_str())
    clone.no_padding()
    clone.no_truncation()
    clone.save(str(path))


def _versions() -> dict:
    import onnx
    import onnxruntime
    import tokenizers
    import torch
    import transformers

    from .. import __version__

    return {"masc_engine": __version__, "torch": torch.__version__, "transformers": transformers.__version__,
            "onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__, "tokenizers": tokenizers.__version__,
            "python": platform.python_version(), "opset": OPSET}


def export_bundle(model: str, out_dir: str | Path, max_num_patches: int | None = None,
                  revision: str | None = None, validate: bool = True, log=print, precision: str = "fp32",
                  transforms: Sequence | None = None, ort_cpu_variant: bool = True,
                  cpu_precision_options: dict | None = None, into=None) -> Path:
    """Export ``model`` to a bundle in ``out_dir`` and validate it.

    The bundle is written to a staging directory beside ``out_dir`` and renamed into place only
    when every graph passed its gates, so a failed export leaves no half-written bundle.

    Args:
        model: Hugging Face id (``google/siglip2-so400m-patch16-naflex``), short name
            (``siglip2-so400m``), local checkpoint directory, or ``random:<preset>``.
        out_dir: bundle directory; must not exist, be empty, or hold a bundle (which is replaced).
        max_num_patches: NaFlex patch budget (default 1024, the paper's).
        revision: Hub revision to pin.
        validate: run the post-export validation (on by default; the manifest records it;
            required for fp16 / bf16).
        precision: ``fp32``, or ``fp16`` / ``bf16``: mixed-precision graphs (export/precision.py)
            validated with the reduced-precision gates of :mod:`masc_engine.tolerances`.
            ``bf16-cpu``: the fp32 bundle, then certified for bf16 on OpenVINO's CPU plugin on the
            staged bundle (export/cpu_precision.py; refused with the figures if the gates fail).
        transforms: further export/transforms.py :class:`~.transforms.GraphTransform` s, run in
            order after the precision transform, each validated and recorded in the manifest.
        ort_cpu_variant: fp32 only: also write the fused ONNX Runtime CPU graphs (the ``ort-cpu``
            variant, export/fusion.py :class:`~.fusion.FusionTransform`, run last in the transform
            pipeline; the manifest's ``variants``), validated like the portable ones.
        cpu_precision_options: ``bf16-cpu`` only: keyword arguments of the certification
            (export/cpu_precision.py :func:`~.cpu_precision.certify_bundle`: ``calibration``,
            ``heldout``, ``graphs``, ``threads``, ``max_keep``).
        into: what writes the bundle into the staging directory, called with ``_export_into``'s
            arguments (default ``_export_into``, the SigLIP2 export; export/segmenter.py passes
            the CLIPSeg one).

    Raises:
        CheckpointError: the checkpoint cannot be loaded or is not SigLIP2.
        ExportValidationError: a graph disagrees with PyTorch beyond its gates (for fp16 / bf16
            the message gives the figures and suggests fp32); nothing is left at ``out_dir``.
        BundleError: ``out_dir`` is a non-empty directory that is not a bundle.
        FusionError: an attention block of the vision or text graph did not fuse.
        CertificationError: ``bf16-cpu`` fails its gates (export/cpu_precision.py; nothing is left).
        BackendUnavailableError: ``bf16-cpu`` without openvino or native bf16 (before exporting).
    """
    from .cpu_precision import BF16_CPU, certify_bundle
    from .precision import PRECISIONS

    certify = precision == BF16_CPU  # fp32 graphs + an OpenVINO bf16 certificate, made on the stage below
    if certify:
        from ..engine.backends.openvino import check_available

        check_available(precision="bf16")  # before the long export: openvino installed, native bf16 on this CPU
        precision = "fp32"
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if precision != "fp32" and not validate:
        raise ValueError(f"{precision} bundles are kept only if they pass their gates: validate=True")
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / "manifest.json").is_file())):
        raise BundleError(f"{out} exists and is not an empty directory or a bundle; choose another --out")
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = out.with_name(f".{out.name}.{os.getpid()}.partial")
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir()
    try:
        (into or _export_into)(stage, model, max_num_patches, revision, validate, log, precision,
                               list(transforms or []), ort_cpu_variant)
        if certify:
            certify_bundle(stage, log=log, **(cpu_precision_options or {}))
        if out.exists():
            old = out.with_name(f".{out.name}.{os.getpid()}.old")
            out.rename(old)
            stage.rename(out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            stage.rename(out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    log(f"bundle written: {out} ({BF16_CPU if certify else precision})")
    return out


def _bundle_files(d: Path, graphs: dict) -> list[str]:
    files = {"tokenizer.json"}
    for entry in graphs.values():
        files.add(entry["file"])
        files.update(v["file"] for v in entry.get("variants", {}).values())
    files.update(p.name for p in d.iterdir() if p.suffix == ".data")  # external weights (so400m)
    return sorted(files)


def _linked_copy(src: Path, dst: Path, names: Sequence[str]) -> Path:
    """``dst`` holding hard links to ``src``'s files (the fp32 reference while the stage's graphs
    are replaced: a replaced file gets a new inode, the link keeps the old one).

    External-weight files (``*.data``, so400m's graphs) are copied, not linked: the onnx library
    refuses to read external data from a file with more than one hard link ("potential hardlink
    attack"), which made every transform of an so400m graph fail."""
    dst.mkdir()
    for name in names:
        if name.endswith(".data"):
            shutil.copy2(src / name, dst / name)
            continue
        try:
            os.link(src / name, dst / name)
        except OSError:
            shutil.copy2(src / name, dst / name)
    return dst


def _export_into(out: Path, model: str, max_num_patches, revision, validate: bool, log, precision: str,
                 transforms: list, ort_cpu_variant: bool = True) -> None:
    import torch

    from . import cp_head, fusion, graphs, validate as val
    from .precision import PrecisionTransform, emulated_bf16_file, policy
    from .transforms import run_transforms

    t0 = time.time()
    m, processor, source = _load(model, revision)
    image = image_settings_from_processor(m, processor, max_num_patches)
    text = text_settings_from_processor(m, processor)
    _save_tokenizer(processor, out / "tokenizer.json")
    vm, tm = m.vision_model, m.text_model
    if not getattr(vm, "use_head", True) or not hasattr(vm, "head"):
        raise CheckpointError("this checkpoint's vision tower has no attention-pooling head; PF needs it")
    width = int(vm.config.hidden_size)
    if image["mode"] == "naflex":
        vspec = graphs.vision_spec_naflex(vm, image["patch_size"], image["position_grid"], trace_patches=64)
    else:
        vspec = graphs.vision_spec_fixed(vm, image["image_size"][0])
    specs = [vspec, graphs.pool_spec(vm.head, width, trace_tokens=48),
             graphs.text_spec(tm, text["max_length"], int(m.config.text_config.vocab_size)),
             cp_head.cp_spec(width)]
    report = {}
    torch.set_grad_enabled(False)
    for spec in specs:
        t = time.time()
        graphs.export_graph(spec, out / spec.file, opset=OPSET)
        log(f"exported {spec.name} -> {spec.file} ({time.time() - t:.1f}s)")
    if validate:
        report = val.validate_bundle_graphs(out, m, processor, image, text, log=log)
    graph_entries = {s.name: s.manifest_entry() for s in specs}
    manifest = {
        "source": source,
        "architecture": {"model_type": m.config.model_type, "vision_width": width,
                         "text_projection": int(tm.head.out_features),
                         "vision_layers": int(vm.config.num_hidden_layers),
                         "pool_heads": int(vm.head.attention.num_heads)},
        "image": image,
        "text": text,
        "scoring": {"fg_threshold": DEFAULT_FG_THRESHOLD,
                    "cp_keeps": "reference patches with weight > fg_threshold",
                    "pf_hides": "output patches with weight >= fg_threshold, and padding slots",
                    "mask_downsample": "bilinear, align_corners=False, no antialias, clamp [0, 1]",
                    "reference": "masc-metric 0.3.0"},
        "graphs": graph_entries,
        "validation": report,
        "precision": {"mode": "fp32"},
        "transforms": [],
        "variants": {},
        "versions": _versions(),
        "files": _bundle_files(out, graph_entries),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if precision != "fp32":
        transforms = [PrecisionTransform(precision)] + transforms
    # The fused ONNX Runtime CPU graphs are made from fp32 graphs only (ONNX Runtime's fusions and
    # their validation are measured there); reduced-precision bundles keep their portable graphs.
    fused = fusion.FusionTransform.for_model(m) if ort_cpu_variant and precision == "fp32" else None
    if fused is not None:
        transforms = transforms + [fused]
    if transforms:
        import tempfile

        with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.fp32ref.") as tmp:
            fp32_ref = None
            if precision != "fp32":  # the reduced-precision pair gates score against these fp32 graphs
                fp32_ref = _linked_copy(out, Path(tmp) / "fp32", manifest["files"])
                write_manifest(fp32_ref, manifest)
            check = ((lambda g, path, gates: val.validate_graph(g, path, out, m, processor, image, text, gates))
                     if validate else (lambda g, path, gates: {"skipped": True}))
            records = run_transforms(out, graph_entries, transforms, check, log=log)
            _drop_unreferenced_data(out, graph_entries)
            manifest["transforms"] = records
            manifest["files"] = _bundle_files(out, graph_entries)
            if precision != "fp32":
                write_manifest(out, manifest)
                scored = out
                if precision == "bf16":  # no bf16 kernels on ORT CPU: score the emulated graphs
                    scored = _linked_copy(out, Path(tmp) / "bf16emu", ["tokenizer.json"])
                    for e in graph_entries.values():
                        emulated_bf16_file(out / e["file"], scored / e["file"])
                    plain = {g: {k: v for k, v in e.items() if k != "variants"} for g, e in graph_entries.items()}
                    write_manifest(scored, {**manifest, "graphs": plain,
                                            "files": ["tokenizer.json"] + [e["file"] for e in plain.values()]})
                pair_report = val.validate_pairs(fp32_ref, scored, precision)
                log(f"{precision} pair gates: max |dCP| {pair_report['max_abs_dcp']:.2e}, max |dPF| "
                    f"{pair_report['max_abs_dpf']:.2e} over {pair_report['pairs']} pairs")
                manifest["precision"] = {
                    "mode": precision, "graphs": list(transforms[0].graphs), "policy": policy(),
                    "pair_gates": pair_report,
                    "validated_on": "ONNX Runtime CPU" + (", bf16 emulated (export/precision.py emulate_bf16)"
                                                          if precision == "bf16" else ""),
                }
            if fused is not None:
                entry = {"runtime": dict(fused.runtime), "transform": fused.name, "graphs": list(fused.graphs)}
                if validate:
                    entry["validation"] = {"scores": fusion.validate_variant_scores(out, graph_entries, m, processor,
                                                                                    image, text)}
                    log(f"validated {fusion.VARIANT} scores: max |dCP| {entry['validation']['scores']['max_abs_dcp']:.2e}, "
                        f"max |dPF| {entry['validation']['scores']['max_abs_dpf']:.2e}")
                manifest["variants"][fusion.VARIANT] = entry
    manifest["export_seconds"] = round(time.time() - t0, 1)
    from .onnx_check import check_graphs  # every graph passes the ONNX checker, or no bundle

    manifest["onnx_checker"] = {"full_check": True, "graphs": check_graphs(out, manifest["files"])}
    write_manifest(out, manifest)


def _drop_unreferenced_data(out: Path, graph_entries: dict) -> None:
    """Remove external-weight files no graph of the bundle references any more (a replaced
    so400m fp32 graph's ``.data``)."""
    import onnx

    used = set()
    for name in _bundle_files(out, graph_entries):
        if name.endswith(".onnx"):
            model = onnx.load(str(out / name), load_external_data=False)
            for t in model.graph.initializer:
                for kv in t.external_data:
                    if kv.key == "location":
                        used.add(kv.value)
    for p in out.iterdir():
        if p.suffix == ".data" and p.name not in used:
            p.unlink()


def dumps_report(report: dict) -> str:
    return json.dumps(report, indent=2)
