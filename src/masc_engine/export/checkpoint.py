"""Opening a SigLIP2 checkpoint for export: ids and short names, the built-in random-weight models,
and the manifest's image and text settings read from the checkpoint's processor.

Runs where PyTorch runs: in the exporter's worker process (export/torch_worker.py), and in
benchmarks that load the reference model.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from ..engine.cache_root import CHECKPOINTS, cache_root
from ..errors import MascEngineError
from .random_models import build_random_checkpoint, is_random_model_id, preset_names

DEFAULT_MODEL = "google/siglip2-so400m-patch16-naflex"
#: Short names accepted by ``--model``.
SHORT_NAMES = {
    "siglip2-so400m": "google/siglip2-so400m-patch16-naflex",
    "siglip2-base": "google/siglip2-base-patch16-naflex",
    "siglip2-base-512": "google/siglip2-base-patch16-512",
}
#: What a failure to load says about the way out when the Hub is out of reach.
OFFLINE_HINT = "without network access (or with HF_HUB_OFFLINE set), pass --model /local/folder"
#: The paper's patch budget (masc-metric 0.3.0 ``DEFAULT_NAFLEX_MAX_PATCHES``).
DEFAULT_MAX_NUM_PATCHES = 1024
_PIL_NAMES = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}


class CheckpointError(MascEngineError):
    """The checkpoint cannot be loaded (unknown id, gated, not SigLIP2)."""


def random_checkpoint_dir(name: str) -> Path:
    """Local directory of a built-in random-weight checkpoint, built on first use.

    Cached under ``<cache root>/random-models`` (:func:`masc_engine.engine.cache_root.cache_root`:
    ``$MASC_ENGINE_CACHE``, default ``~/.cache/masc-engine``; ``masc-cache clean --checkpoints``
    removes them) per transformers and torch version, since the random draw depends on both. The directory name keeps ``naflex`` in
    it for NaFlex presets: masc-metric 0.3.0 decides NaFlex from ``"naflex" in model_id``, and the
    oracle tests load the same directory.
    """
    import torch
    import transformers

    key = name.split(":", 1)[-1]
    if key not in preset_names():
        raise CheckpointError(
            f"unknown random model {name!r}; known: {', '.join('random:' + k for k in preset_names())}"
        )
    d = cache_root() / CHECKPOINTS / f"{key}-tf{transformers.__version__}-torch{torch.__version__.split('+')[0]}"
    if not (d / "masc_random_model.json").is_file():
        tmp = d.with_name(d.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        build_random_checkpoint(key, tmp)
        if not d.exists():
            tmp.rename(d)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return d


def checkpoint_source(model: str, revision: str | None, short_names: dict[str, str] = SHORT_NAMES) -> tuple[str, dict]:
    """Where ``--model`` loads from, and the manifest's ``source`` record.

    Args:
        model: a Hugging Face id, a short name of ``short_names``, a local folder, or ``random:<preset>``
            (built on first use by :func:`random_checkpoint_dir`).
        revision: the Hub revision asked for, or None.
        short_names: the exporter's short names (SigLIP2's here; the segmenter export passes its own).

    Returns:
        ``(path, source)``: the path or id for ``from_pretrained``, and ``{"model", "revision",
        "random_weights"}`` (plus ``preset`` and ``checkpoint_dir`` for a random model).
    """
    source = {"model": model, "revision": revision, "random_weights": False}
    if is_random_model_id(model):
        path = str(random_checkpoint_dir(model))
        source.update(random_weights=True, preset=model.split(":", 1)[1], checkpoint_dir=path)
    else:
        source["model"] = path = short_names.get(model, model)
    return path, source


def pin_revision(model, source: dict) -> None:
    """Record the commit ``from_pretrained`` resolved in ``source["revision"]`` when none was asked."""
    commit = getattr(model.config, "_commit_hash", None)
    if commit and not source.get("revision"):
        source["revision"] = commit


def load_checkpoint(model: str, revision: str | None):
    """Load model + processor; return (model, processor, source dict)."""
    from transformers import AutoModel, AutoProcessor

    path, source = checkpoint_source(model, revision)
    model = source["model"]
    try:
        m = AutoModel.from_pretrained(path, revision=revision, attn_implementation="eager")
        processor = AutoProcessor.from_pretrained(path, revision=revision)
    except OSError as e:
        text = str(e)
        if "gated" in text.lower() or "401" in text or "403" in text:
            raise CheckpointError(
                f"{model} is a gated model: accept its licence on its Hugging Face page, then run "
                "`hf auth login` (or set HF_TOKEN) and export again. Original error: " + text
            ) from e
        raise CheckpointError(
            f"cannot load {model!r} as a Hugging Face id or local checkpoint: {text}; {OFFLINE_HINT}"
        ) from e
    m.eval()
    pin_revision(m, source)
    return m, processor, source


def image_settings_from_processor(model, processor, max_num_patches: int | None) -> dict:
    """The manifest's ``image`` section, read from the loaded processor and config."""
    ip = processor.image_processor
    vcfg = model.config.vision_config
    family = model.config.model_type
    resample = ip.resample
    resample = _PIL_NAMES[int(getattr(resample, "value", resample))]
    common = dict(
        patch_size=int(vcfg.patch_size),
        resample=resample,
        rescale_factor=float(ip.rescale_factor),
        image_mean=[float(x) for x in ip.image_mean],
        image_std=[float(x) for x in ip.image_std],
        do_rescale=bool(ip.do_rescale),
        do_normalize=bool(ip.do_normalize),
        image_processor=type(ip).__name__,
    )
    if not (common["do_rescale"] and common["do_normalize"]):
        raise CheckpointError("image processors without rescale+normalize are not supported")
    if family == "siglip2":
        budget = int(max_num_patches or DEFAULT_MAX_NUM_PATCHES)
        return dict(
            mode="naflex",
            max_num_patches=budget,
            image_size=None,
            position_grid=int(round(vcfg.num_patches**0.5)),
            **common,
        )
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
        tokenizer_file="tokenizer.json",
        max_length=max_length,
        padding="max_length",
        padding_side=tok.padding_side,
        truncation_side=tok.truncation_side,
        pad_token=str(tok.pad_token),
        pad_token_id=int(tok.pad_token_id),
        special_tokens={k: str(v) for k, v in tok.special_tokens_map.items()},
        special_token_ids={str(t): int(tok.convert_tokens_to_ids(t)) for t in tok.all_special_tokens},
        lowercase=tok("ABC", add_special_tokens=False)["input_ids"]
        == tok("abc", add_special_tokens=False)["input_ids"],
        reference_truncates=bool(defaults.get("truncation", False)),
        text_tower_attention_mask=False,
        tokenizer_class=type(tok).__name__,
        vocab_size=int(model.config.text_config.vocab_size),  # the text tower's embedding rows
    )


def save_tokenizer(processor, path: Path) -> None:
    backend = processor.tokenizer.backend_tokenizer
    from tokenizers import Tokenizer

    clone = Tokenizer.from_str(backend.to_str())
    clone.no_padding()
    clone.no_truncation()
    clone.save(str(path))
