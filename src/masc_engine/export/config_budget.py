"""A checkpoint's size read from its ``config.json``, checked against the export's memory budget
before any model is built, and the Hub probe that fetches that file.

transformers builds every layer a config names before a weight is read: a ``config.json`` with
``num_hidden_layers: 10000000`` builds layers for minutes until memory runs out. So the exporter
reads the config first (a few kB: a local folder's file, or the Hub's, one request), estimates
each graph's parameters from the shapes it names (layers x width x MLP width, vocabulary x width,
position and patch embeddings) and refuses in one line, with the estimate and the budget, a plan
that does not fit (export/stages.py :func:`~.stages.check_memory_plan`: ``--max-memory-gb``, else
this machine's or container's memory), before PyTorch or transformers is imported.

The Hub probe (:func:`hub_config`) makes one request, without retries, and none at all when
``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) is set (then the local cache only); any failure
is a :class:`~.checkpoint.CheckpointError` of one line naming ``--model /local/folder``.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from .checkpoint import CheckpointError
from .random_models import is_random_model_id, preset_config
from .stages import THEN_STAGES, ExportMemoryError, check_memory_plan, plan_memory

logger = logging.getLogger(__name__)

#: bytes of one fp32 parameter (the plan's unit: export/stages.py ``MEMORY_MODEL``)
FP32 = 4
#: transformers' defaults for what a config may leave out: ``SiglipVisionConfig`` /
#: ``SiglipTextConfig`` (SigLIP2's are the same) and CLIPSeg's ``CLIPSeg*Config``.
_DEFAULTS = {
    "siglip_vision": {
        "hidden_size": 768,
        "intermediate_size": 3072,
        "num_hidden_layers": 12,
        "patch_size": 16,
        "image_size": 224,
        "num_channels": 3,
        "num_patches": 256,
    },
    "siglip_text": {
        "hidden_size": 768,
        "intermediate_size": 3072,
        "num_hidden_layers": 12,
        "vocab_size": 32000,
        "max_position_embeddings": 64,
    },
    "clip_vision": {
        "hidden_size": 768,
        "intermediate_size": 3072,
        "num_hidden_layers": 12,
        "patch_size": 32,
        "image_size": 224,
        "num_channels": 3,
    },
    "clip_text": {
        "hidden_size": 512,
        "intermediate_size": 2048,
        "num_hidden_layers": 12,
        "vocab_size": 49408,
        "max_position_embeddings": 77,
    },
    "clipseg": {"projection_dim": 512, "reduce_dim": 64, "decoder_intermediate_size": 2048},
    "clip": {"projection_dim": 512},
    "vit": {
        "hidden_size": 768,
        "intermediate_size": 3072,
        "num_hidden_layers": 12,
        "patch_size": 16,
        "image_size": 224,
        "num_channels": 3,
    },
    "dinov2": {
        "hidden_size": 768,
        "num_hidden_layers": 12,
        "patch_size": 14,
        "image_size": 518,
        "num_channels": 3,
        "mlp_ratio": 4,
    },
}
OFFLINE_WAY_OUT = (
    "pass --model /local/folder (a checkpoint folder holding config.json, the weights and the processor files)"
)


def offline() -> bool:
    """Whether the Hub must not be asked: ``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE`` set now
    (huggingface_hub reads them once, at import)."""
    env = any(
        os.environ.get(k, "").strip().upper() in ("1", "ON", "YES", "TRUE")
        for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )
    if env:
        return True
    try:
        from huggingface_hub import constants
    except ImportError:
        return False
    return bool(constants.HF_HUB_OFFLINE)


def names_model_of_kind(model: str, revision: str | None, presets, short_names, model_types) -> bool:
    """Whether ``model`` (a ``--model`` value) names a checkpoint of one bundle kind: a ``random:``
    preset in ``presets``, a name in ``short_names`` (the scorer's short names are not), else a
    local folder or Hub id whose ``config.json`` has a ``model_type`` in ``model_types`` (a folder
    without one is not: it is refused where the checkpoint is read, with its own message).

    Raises:
        CheckpointError: a Hub id whose config cannot be fetched; an unreadable local config.json.
    """
    from .checkpoint import SHORT_NAMES as SCORER_SHORT_NAMES

    if is_random_model_id(model):
        return model.split(":", 1)[1] in presets
    if model in short_names:
        return True
    if model in SCORER_SHORT_NAMES:
        return False
    path = Path(model)
    if path.is_dir():
        if not (path / "config.json").exists():
            return False
        return read_config_json(path / "config.json", model).get("model_type") in model_types
    return hub_config(model, revision).get("model_type") in model_types


def _path_like(model: str) -> bool:
    """Whether ``model`` is written as a path (absolute, relative with ``.``, home ``~``, more than
    one ``/``, or a backslash), which a Hugging Face id never is."""
    return model.startswith(("/", ".", "~")) or model.count("/") > 1 or "\\" in model


def hub_config(repo_id: str, revision: str | None = None) -> dict:
    """``config.json`` of the Hub checkpoint ``repo_id``: one request without retries (the cache
    only when :func:`offline`).

    Raises:
        MissingDependencyError: huggingface_hub (the export extra) is not installed.
        CheckpointError: one line: offline and not cached, the Hub unreachable, no such
            repository, a gated one, or not a JSON object; each offline or network failure names
            ``--model /local/folder``.
    """
    try:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import (
            EntryNotFoundError,
            GatedRepoError,
            HFValidationError,
            LocalEntryNotFoundError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )
    except ImportError as e:
        from ..extras import missing

        raise missing(e.name or "huggingface_hub", "masc-export", extra="export") from None

    try:
        cached = None if offline() else _reach_hub(repo_id, revision)
        path = cached or hf_hub_download(repo_id, "config.json", revision=revision, local_files_only=offline())
    except HFValidationError as e:
        if _path_like(repo_id):  # a folder that is not there: the Hub's id rules would only confuse
            raise CheckpointError(
                f"no checkpoint folder at {repo_id!r}: a local --model is an existing folder holding "
                "config.json (a Hugging Face id is 'name' or 'namespace/name')"
            ) from None
        raise CheckpointError(
            f"{repo_id!r} is neither a local checkpoint folder nor a Hugging Face id ({_first_line(e)})"
        ) from None
    except GatedRepoError:
        raise CheckpointError(
            f"{repo_id} is a gated model: accept its licence on its Hugging Face page, then run "
            "`hf auth login` (or set HF_TOKEN) and export again"
        ) from None
    except LocalEntryNotFoundError:  # a subclass of EntryNotFoundError: first
        why = (
            "HF_HUB_OFFLINE is set and it is not in the local Hugging Face cache"
            if offline()
            else "the Hugging Face Hub cannot be reached and it is not in the local cache"
        )
        raise CheckpointError(f"{repo_id}: {why}; {OFFLINE_WAY_OUT}") from None
    except (RepositoryNotFoundError, RevisionNotFoundError, EntryNotFoundError) as e:
        raise CheckpointError(
            f"{repo_id}: no such checkpoint on the Hugging Face Hub ({type(e).__name__}); "
            "check the id and --revision, or " + OFFLINE_WAY_OUT
        ) from None
    except OSError as e:  # connection errors, timeouts (httpx's errors subclass neither; see below)
        raise CheckpointError(
            f"{repo_id}: the Hugging Face Hub cannot be reached ({_first_line(e)}); {OFFLINE_WAY_OUT}"
        ) from None
    except Exception as e:  # noqa: BLE001 - an HTTP client's error: one line, never a traceback
        raise CheckpointError(
            f"{repo_id}: cannot fetch its config.json from the Hugging Face Hub "
            f"({type(e).__name__}: {_first_line(e)}); {OFFLINE_WAY_OUT}"
        ) from None
    return read_config_json(Path(path), repo_id)


def _reach_hub(repo_id: str, revision: str | None) -> str | None:
    """One HEAD request for ``config.json``, without retries (``hf_hub_download`` retries five
    times, 23 s of back-off, when the Hub cannot be reached and nothing is cached). None when the
    Hub answered (the download follows); the cached file when it did not and one is cached.

    Raises:
        LocalEntryNotFoundError: the Hub cannot be reached and nothing is cached.
        (the Hub's own answers: RepositoryNotFoundError, GatedRepoError, ...)
    """
    from huggingface_hub import get_hf_file_metadata, hf_hub_url, try_to_load_from_cache
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        get_hf_file_metadata(hf_hub_url(repo_id, "config.json", revision=revision), timeout=10)
        return None
    except HfHubHTTPError:
        raise
    except Exception as e:  # noqa: BLE001 - connection refused, no DNS, timeout: the Hub is out of reach
        cached = try_to_load_from_cache(repo_id, "config.json", revision=revision)
        if isinstance(cached, str):
            return cached
        raise LocalEntryNotFoundError(f"the Hub cannot be reached ({type(e).__name__})") from e


def read_config(model: str, revision: str | None, short_names: dict[str, str]) -> dict | None:
    """The ``config.json`` of a ``--model`` value: a local folder's, or the Hub's (short names
    expanded first, from ``short_names``); a built-in ``random:`` preset's shapes
    (random_models.py ``preset_config``), before its checkpoint is built.

    Raises:
        CheckpointError: see :func:`hub_config`; a local folder without a readable config.json.
    """
    if is_random_model_id(model):
        try:
            return preset_config(model)
        except KeyError:
            return None  # an unknown preset: refused where the checkpoint is built, with the list
    if Path(model).is_dir():
        return read_config_json(Path(model) / "config.json", model)
    return hub_config(short_names.get(model, model), revision)


#: Largest config.json read, bytes (a checkpoint's is a few KiB).
MAX_CONFIG_BYTES = 4 * 2**20


def read_config_json(path: Path, model: str) -> dict:
    """A checkpoint's ``config.json`` as a dict, read with a byte cap (a symlink to /dev/zero or a
    huge file costs at most :data:`MAX_CONFIG_BYTES`).

    Args:
        path: the config.json file.
        model: the ``--model`` value, for the message.

    Raises:
        CheckpointError: one line: unreadable, over the cap, not JSON (nesting too deep
            included) or not a JSON object.
    """
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
        if len(raw) > MAX_CONFIG_BYTES:
            raise CheckpointError(
                f"{model}: its config.json is over {MAX_CONFIG_BYTES >> 20} MiB (a checkpoint's config is a few KiB)"
            )
        cfg = json.loads(raw.decode("utf-8"))
    except (OSError, ValueError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise CheckpointError(f"{model}: cannot read its config.json ({_first_line(e)})") from None
    except RecursionError:
        raise CheckpointError(f"{model}: its config.json is nested too deep to be a checkpoint's config") from None
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{model}: its config.json is not a JSON object")
    return cfg


def _first_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return (text[:300] + "...") if len(text) > 300 else (text or type(e).__name__)


def _int(cfg: dict, key: str, kind: str, where: str) -> int:
    """``cfg[key]`` (default: transformers') as a non-negative integer."""
    v = cfg.get(key, _DEFAULTS[kind].get(key))
    if isinstance(v, float) and v.is_integer() and abs(v) < 2**63:
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise CheckpointError(f"config.json: {where}{key} must be a non-negative integer, got {str(v)[:40]!r}")
    return v


def _section(cfg: dict, key: str) -> dict:
    sub = cfg.get(key) or {}
    if not isinstance(sub, dict):
        raise CheckpointError(f"config.json: {key} must be a JSON object")
    return sub


def _encoder(d: int, mlp: int, layers: int) -> int:
    """Parameters of ``layers`` pre-norm transformer layers of width ``d``: q, k, v, o
    projections with biases, the two-layer MLP, two LayerNorms. With the embeddings below, the
    estimate equals transformers' parameter count at the so400m SigLIP2 shape (1,135,670,962) and
    is 0.04% above it for CLIPSeg's defaults (tests/test_export_refusals.py)."""
    return layers * (4 * d * d + 2 * d * mlp + 9 * d + mlp)


def _tower(cfg: dict, kind: str, where: str) -> tuple[dict, int, int, int]:
    shape = {k: _int(cfg, k, kind, where) for k in ("hidden_size", "intermediate_size", "num_hidden_layers")}
    d, mlp, n = shape["hidden_size"], shape["intermediate_size"], shape["num_hidden_layers"]
    return shape, d, mlp, _encoder(d, mlp, n) + 2 * d


def _vision(cfg: dict, kind: str, where: str) -> tuple[dict, int, int]:
    """(shape, width, parameters) of a ViT: patch and position embeddings, the encoder."""
    shape, d, mlp, params = _tower(cfg, kind, where)
    p, c = _int(cfg, "patch_size", kind, where), _int(cfg, "num_channels", kind, where)
    side = _int(cfg, "image_size", kind, where) // max(p, 1)
    positions = _int(cfg, "num_patches", kind, where) if "num_patches" in _DEFAULTS[kind] else side * side + 1
    pre_norm = 2 * d if kind == "clip_vision" else 0  # CLIP's LayerNorm before the encoder
    return shape, d, params + c * p * p * d + d + positions * d + pre_norm


def _text(cfg: dict, kind: str, where: str) -> tuple[dict, int, int]:
    """(shape, width, parameters) of a text tower: token and position embeddings, the encoder."""
    shape, d, mlp, params = _tower(cfg, kind, where)
    vocab, pos = _int(cfg, "vocab_size", kind, where), _int(cfg, "max_position_embeddings", kind, where)
    shape["vocab_size"] = vocab
    return shape, d, params + (vocab + pos) * d


def estimate_parameters(config: dict) -> tuple[dict[str, int], dict[str, dict]]:
    """Parameters of each exported graph, from a SigLIP / SigLIP2 or CLIPSeg ``config.json``.

    Args:
        config: the parsed ``config.json`` (``model_type`` ``siglip``, ``siglip2`` or ``clipseg``;
            any other is estimated as SigLIP, the exporter refuses it later).

    Returns:
        ``(parameters, shapes)``: ``{graph: parameters}`` (``vision``, ``pool``, ``text`` for a
        scorer; ``vision``, ``text``, ``decoder`` for CLIPSeg) and the shapes they come from
        (``{tower: {hidden_size, intermediate_size, num_hidden_layers[, vocab_size]}}``).

    Raises:
        CheckpointError: a size in the config is not a non-negative integer.
    """
    v, t = _section(config, "vision_config"), _section(config, "text_config")
    if config.get("model_type") in ("clip", "vit", "dinov2"):
        return _embedder_parameters(config, v, t)
    if config.get("model_type") == "clipseg":
        vs, dv, vp = _vision(v, "clip_vision", "vision_config.")
        ts, dt, tp = _text(t, "clip_text", "text_config.")
        proj = _int(config, "projection_dim", "clipseg", "")
        r = _int(config, "reduce_dim", "clipseg", "")
        dmlp = _int(config, "decoder_intermediate_size", "clipseg", "")
        k = len(config.get("extract_layers") or [3, 6, 9])
        decoder = k * (dv * r + r) + 2 * (proj * r + r) + _encoder(r, dmlp, k) + 2 * r * r * 16
        params = {"vision": vp + dv * proj, "text": tp + dt * proj, "decoder": decoder}
        return params, {"vision": vs, "text": ts, "decoder": {"reduce_dim": r, "layers": k}}
    vs, dv, vp = _vision(v, "siglip_vision", "vision_config.")
    ts, dt, tp = _text(t, "siglip_text", "text_config.")
    pool = dv + (4 * dv * dv + 4 * dv) + 2 * dv + (2 * dv * vs["intermediate_size"] + vs["intermediate_size"] + dv)
    return {"vision": vp, "pool": pool, "text": tp + dt * dt + dt}, {"vision": vs, "text": ts}


def _embedder_parameters(config: dict, v: dict, t: dict) -> tuple[dict[str, int], dict[str, dict]]:
    """:func:`estimate_parameters` of an embedder (export/embedders.py): CLIP's ``image`` and
    ``text`` graphs (towers plus projections), a ViT's or DINOv2's ``image`` graph."""
    kind = config["model_type"]
    if kind == "clip":
        vs, dv, vp = _vision(v, "clip_vision", "vision_config.")
        ts, dt, tp = _text(t, "clip_text", "text_config.")
        proj = _int(config, "projection_dim", "clip", "")
        return {"image": vp + dv * proj, "text": tp + dt * proj}, {"image": vs, "text": ts}
    tower = dict(config)
    if kind == "dinov2":  # the MLP width is hidden_size x mlp_ratio (no intermediate_size)
        ratio = config.get("mlp_ratio", _DEFAULTS["dinov2"]["mlp_ratio"])
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 <= ratio <= 1024:
            raise CheckpointError(f"config.json: mlp_ratio must be a number from 0 to 1024, got {str(ratio)[:40]!r}")
        tower["intermediate_size"] = int(_int(config, "hidden_size", kind, "") * ratio)
    vs, dv, vp = _vision(tower, kind, "")
    if kind == "vit":
        return {"image": vp + dv}, {"image": vs}  # + the class token
    # + the class and mask tokens, and each layer's two LayerScale vectors
    return {"image": vp + 2 * dv + 2 * dv * vs["num_hidden_layers"]}, {"image": vs}


def _describe(shapes: dict) -> str:
    parts = []
    for tower, s in shapes.items():
        if "num_hidden_layers" in s:
            parts.append(
                f"{tower} {s['num_hidden_layers']:,} layers x width {s['hidden_size']:,} "
                f"(MLP {s['intermediate_size']:,})" + (f", vocabulary {s['vocab_size']:,}" if "vocab_size" in s else "")
            )
    return "; ".join(parts)


def check_config_budget(
    model: str, config: dict, max_memory_gb: float | None, precision: str = "fp32", fused: bool = True
) -> str:
    """Refuse, from its config alone, a checkpoint whose export plan does not fit the budget.

    The plan is export/stages.py's (:func:`~.stages.plan_memory`) on the fp32 bytes of
    :func:`estimate_parameters`; the budget ``max_memory_gb``, else this machine's or
    container's memory (:func:`~.stages.machine_memory_bytes`).

    Returns:
        a line describing the estimate and the budget.

    Raises:
        ExportMemoryError: one line with the estimate, the shapes it comes from and the budget.
        CheckpointError: a size in the config is not a non-negative integer.
    """
    params, shapes = estimate_parameters(config)
    plan = plan_memory(
        {g: n * FP32 for g, n in params.items()},
        precision if precision in ("fp16", "bf16") else "fp32",
        fused=fused,
        then=precision if precision in THEN_STAGES else None,
    )
    what = f"estimated from its config.json before building the model: {_describe(shapes)}"
    try:
        line = check_memory_plan(plan, max_memory_gb, model)
    except ExportMemoryError as e:
        raise ExportMemoryError(f"{e} ({what})") from None
    return f"{line} ({what})"


def preflight(
    model: str,
    revision: str | None,
    short_names: dict[str, str],
    max_memory_gb: float | None,
    precision: str = "fp32",
    fused: bool = True,
) -> Any:
    """:func:`read_config` then :func:`check_config_budget`, before any PyTorch work (a
    ``random:`` preset before its checkpoint is built). Returns the config (or None).

    Raises:
        CheckpointError: see :func:`read_config` and :func:`estimate_parameters`.
        ExportMemoryError: see :func:`check_config_budget`.
    """
    config = read_config(model, revision, short_names)
    if config is not None:
        logger.info(check_config_budget(model, config, max_memory_gb, precision, fused))
    return config
