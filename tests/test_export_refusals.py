"""masc-export refuses a bad checkpoint early, in one line, without the network when told so.

- A ``config.json`` naming ten million layers is refused from its shapes, with the estimate and the
  budget, before any model is built (transformers would build layers for minutes).
- Every refusal of a bad checkpoint is one ``Error:`` line naming the cause; a library's traceback
  (from the PyTorch worker too) goes to the export log.
- Hub probes respect ``HF_HUB_OFFLINE``: no request, no retries; short names are expanded before
  any Hub call; the error names ``--model /local/folder``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from masc_engine.cli.export_cmd import main as export_main
from masc_engine.export.torch_worker import TorchWorker as REAL_WORKER
from masc_engine.tolerances import CONFIG_ESTIMATE_RTOL, PRESET_ESTIMATE_MAX_OVER, PRESET_ESTIMATE_MAX_UNDER

SO400M_VISION = {
    "hidden_size": 1152,
    "intermediate_size": 4304,
    "num_attention_heads": 16,
    "patch_size": 16,
    "num_patches": 256,
}
SO400M_TEXT = {
    "hidden_size": 1152,
    "intermediate_size": 4304,
    "num_hidden_layers": 27,
    "num_attention_heads": 16,
    "vocab_size": 256000,
    "max_position_embeddings": 64,
}


@pytest.fixture(autouse=True)
def no_network_no_model(monkeypatch):
    """Offline (the environment and huggingface_hub's own flag, read at its import), and any
    attempt to build a model fails the test: the PyTorch worker and the segmenter's loader."""
    import huggingface_hub.constants as hc

    from masc_engine.export import segmenter, torch_worker

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", True)
    built = []

    class NoWorker:
        def __init__(self, *a, **k):
            built.append("torch worker")
            raise AssertionError("the PyTorch worker was started: a model would be built")

    def no_segmenter(*a, **k):
        built.append("segmenter")
        raise AssertionError("the CLIPSeg model was built")

    monkeypatch.setattr(torch_worker, "TorchWorker", NoWorker)
    monkeypatch.setattr(segmenter, "load_segmenter", no_segmenter)
    return built


def _checkpoint(folder: Path, config: dict) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _errors(res) -> list[str]:
    return [ln for ln in res.output.splitlines() if ln.startswith("Error:")]


def _export(*args: str):
    return CliRunner().invoke(export_main, list(args))


def test_huge_config_is_refused_before_any_model_is_built(tmp_path, no_network_no_model):
    ckpt = _checkpoint(
        tmp_path / "huge",
        {
            "model_type": "siglip2",
            "architectures": ["Siglip2Model"],
            "vision_config": {**SO400M_VISION, "num_hidden_layers": 10_000_000},
            "text_config": SO400M_TEXT,
        },
    )
    out = tmp_path / "bundles" / "b"
    res = _export("--model", str(ckpt), "--out", str(out), "--max-memory-gb", "8")
    assert res.exit_code == 1 and no_network_no_model == [], (res.output, no_network_no_model)
    (err,) = _errors(res)
    # the estimate (10^7 layers x (4 x 1152^2 + 2 x 1152 x 4304 + ...) fp32 parameters), the shapes and the budget
    assert "needs about 1219161.1 GB" in err and "vision 10,000,000 layers x width 1,152 (MLP 4,304)" in err, err
    assert "more than --max-memory-gb 8 (8.0 GB)" in err and "before building the model" in err
    assert "Traceback" not in res.output and not out.exists() and not list(out.parent.glob(".b.*"))
    # without --max-memory-gb: the machine's (or container's) memory is the budget
    res = _export("--model", str(ckpt), "--out", str(out))
    assert res.exit_code == 1 and no_network_no_model == []
    (err,) = _errors(res)
    assert "more than this machine's memory" in err and "10,000,000 layers" in err


def test_huge_segmenter_config_is_refused_before_the_model_is_built(tmp_path, no_network_no_model):
    ckpt = _checkpoint(
        tmp_path / "seg",
        {
            "model_type": "clipseg",
            "extract_layers": [3, 6, 9],
            "vision_config": {"hidden_size": 768, "num_hidden_layers": 12},
            "text_config": {"hidden_size": 512, "num_hidden_layers": 10_000_000},
        },
    )
    res = _export("--model", str(ckpt), "--out", str(tmp_path / "b"), "--max-memory-gb", "4")
    assert res.exit_code == 1 and no_network_no_model == [], (res.output, no_network_no_model)
    (err,) = _errors(res)
    assert "text 10,000,000 layers x width 512 (MLP 2,048), vocabulary 49,408" in err
    assert "more than --max-memory-gb 4 (4.0 GB)" in err


@pytest.mark.parametrize("value", ["many", -3, 2.5, True, None])
def test_config_sizes_that_are_not_counts_are_one_line(tmp_path, no_network_no_model, value):
    ckpt = _checkpoint(
        tmp_path / "odd",
        {
            "model_type": "siglip2",
            "vision_config": {**SO400M_VISION, "num_hidden_layers": value},
            "text_config": SO400M_TEXT,
        },
    )
    res = _export("--model", str(ckpt), "--out", str(tmp_path / "b"))
    assert res.exit_code == 1 and no_network_no_model == []
    (err,) = _errors(res)
    assert err.startswith("Error: config.json: vision_config.num_hidden_layers must be a non-negative integer, got")


@pytest.mark.parametrize(
    "kind, expect",
    [
        ("list", "its config.json is not a JSON object"),
        ("deep", "its config.json is nested too deep to be a checkpoint's config"),
        ("zero", "its config.json is over 4 MiB"),
    ],
)
def test_hostile_config_json_is_one_line(tmp_path, no_network_no_model, kind, expect):
    """A local checkpoint whose config.json is ``[]``, nested 100,000 deep, or a symlink to
    /dev/zero: one ``Error:`` line naming the folder (was AttributeError, RecursionError, or a
    MemoryError after gigabytes read)."""
    ckpt = tmp_path / "odd"
    ckpt.mkdir()
    cfg = ckpt / "config.json"
    if kind == "zero":
        cfg.symlink_to("/dev/zero")
    else:
        cfg.write_text("[]" if kind == "list" else "[" * 100_000 + "]" * 100_000)
    res = _export("--model", str(ckpt), "--out", str(tmp_path / "b"))
    assert res.exit_code == 1 and no_network_no_model == [], res.output
    assert "Traceback" not in res.output
    (err,) = _errors(res)
    assert err == f"Error: {ckpt}: {expect}" + (" (a checkpoint's config is a few KiB)" if kind == "zero" else "")


def test_config_estimate_counts_the_real_shapes():
    from masc_engine.export.config_budget import estimate_parameters

    params, shapes = estimate_parameters(
        {
            "model_type": "siglip2",
            "vision_config": {**SO400M_VISION, "num_hidden_layers": 27},
            "text_config": SO400M_TEXT,
        }
    )
    # transformers' Siglip2Model at the so400m shape (counted on the meta device, below)
    assert params == {"vision": 412_649_712, "pool": 15_238_352, "text": 707_782_896}
    assert shapes["text"]["vocab_size"] == 256000


def test_config_estimate_equals_transformers_parameter_counts():
    """The estimate against the models transformers builds from the same configs (on the meta
    device: no memory): exact for SigLIP2, within 0.1% for CLIPSeg (its decoder's convolutions
    are approximated)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from masc_engine.export.config_budget import estimate_parameters

    def count(module) -> int:
        return sum(p.numel() for p in module.parameters())

    v = {**SO400M_VISION, "num_hidden_layers": 27}
    with torch.device("meta"):
        m = transformers.Siglip2Model(transformers.Siglip2Config(vision_config=v, text_config=SO400M_TEXT))
    est, _ = estimate_parameters({"model_type": "siglip2", "vision_config": v, "text_config": SO400M_TEXT})
    head = count(m.vision_model.head)
    assert est == {"vision": count(m.vision_model) - head, "pool": head, "text": count(m.text_model)}
    cfg = transformers.CLIPSegConfig()
    with torch.device("meta"):
        s = transformers.CLIPSegForImageSegmentation(cfg)
    est, _ = estimate_parameters(cfg.to_dict())
    clip = s.clip
    assert est["vision"] == count(clip.vision_model) + count(clip.visual_projection)
    assert est["text"] == count(clip.text_model) + count(clip.text_projection)
    assert sum(est.values()) == pytest.approx(count(s), rel=CONFIG_ESTIMATE_RTOL)


def test_offline_hub_id_fails_at_once_and_names_the_way_out(tmp_path, monkeypatch, no_network_no_model):
    import huggingface_hub

    asked = []
    real = huggingface_hub.hf_hub_download

    def spy(repo_id, filename, **kw):
        asked.append((repo_id, filename, kw.get("local_files_only")))
        return real(repo_id, filename, **kw)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", spy)
    res = _export("--model", "masc-engine-tests/never-cached-checkpoint", "--out", str(tmp_path / "b"))
    assert res.exit_code == 1 and no_network_no_model == []
    (err,) = _errors(res)
    assert "HF_HUB_OFFLINE is set" in err and "--model /local/folder" in err and "Retry" not in res.output
    assert asked and all(local for *_, local in asked)  # the cache only: no request


@pytest.mark.parametrize("model", ["/tmp/no/such/checkpoint", "./no-such-folder", "~/checkpoints/mine", "a/b/c"])
def test_a_missing_local_folder_is_named_as_a_folder(tmp_path, model, no_network_no_model):
    res = _export("--model", model, "--out", str(tmp_path / "b"))
    assert res.exit_code == 1 and no_network_no_model == []
    (err,) = _errors(res)
    assert err == (
        f"Error: no checkpoint folder at {model!r}: a local --model is an existing folder holding "
        "config.json (a Hugging Face id is 'name' or 'namespace/name')"
    )


def test_a_malformed_hub_id_keeps_the_hubs_rule(tmp_path, no_network_no_model):
    res = _export("--model", "not an id", "--out", str(tmp_path / "b"))
    assert res.exit_code == 1 and no_network_no_model == []
    (err,) = _errors(res)
    assert err.startswith("Error: 'not an id' is neither a local checkpoint folder nor a Hugging Face id (")


def test_short_names_are_expanded_before_any_hub_call(tmp_path, monkeypatch, no_network_no_model):
    import huggingface_hub

    asked = []
    real = huggingface_hub.hf_hub_download
    monkeypatch.setattr(
        huggingface_hub,
        "hf_hub_download",
        lambda repo_id, filename, **kw: asked.append(repo_id) or real(repo_id, filename, **kw),
    )
    res = _export("--model", "siglip2-so400m", "--out", str(tmp_path / "b"))
    assert res.exit_code == 1 and no_network_no_model == []
    (err,) = _errors(res)
    assert err.startswith("Error: google/siglip2-so400m-patch16-naflex: HF_HUB_OFFLINE is set")
    assert "--model /local/folder" in err
    assert asked and set(asked) == {"google/siglip2-so400m-patch16-naflex"}  # never "siglip2-so400m"


@pytest.mark.slow
def test_a_library_error_in_the_worker_is_one_line_with_its_traceback_in_the_log(tmp_path, monkeypatch):
    """transformers fails on the config (an unknown activation) inside the PyTorch worker: one
    ``Error:`` line naming the cause; the worker's traceback is in the export log."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from masc_engine.export import torch_worker
    from masc_engine.export.checkpoint import random_checkpoint_dir

    monkeypatch.setattr(torch_worker, "TorchWorker", REAL_WORKER)  # the real worker here
    ckpt = tmp_path / "bad"
    shutil.copytree(random_checkpoint_dir("random:tiny-naflex"), ckpt)
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["vision_config"]["hidden_act"] = "no_such_activation"
    (ckpt / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "bundles" / "b"
    res = _export("--model", str(ckpt), "--out", str(out))
    assert res.exit_code == 1, res.output
    (err,) = _errors(res)
    assert "the checkpoint cannot be opened (KeyError: 'no_such_activation')" in err
    assert "Traceback" not in res.output and len(res.output.splitlines()) <= 3  # the stage lines and the error
    log = (tmp_path / "bundles" / "b.export.log").read_text()
    assert "Traceback" in log and "in the PyTorch export worker" in log and "no_such_activation" in log
    assert not out.exists()


def test_random_preset_over_the_budget_is_refused_before_its_checkpoint_is_built(tmp_path, no_network_no_model):
    """A ``random:`` preset's shapes are checked like a config.json, before its checkpoint (3.2 GB
    for so400m) is built and cached."""
    res = _export("--model", "random:so400m-naflex", "--out", str(tmp_path / "b"), "--max-memory-gb", "1")
    assert res.exit_code == 1 and len(_errors(res)) == 1, res.output
    print(_errors(res)[0])
    assert "--max-memory-gb" in _errors(res)[0] and "so400m" in _errors(res)[0], res.output
    assert no_network_no_model == []  # neither the PyTorch worker (which builds the checkpoint) nor CLIPSeg


@pytest.mark.parametrize("preset", ["tiny-naflex", "clipseg-tiny"])
def test_preset_shapes_count_the_checkpoint_it_builds(tmp_path, preset):
    """preset_config's estimate against the random checkpoint actually built: within 5% (the test
    tokenizers' vocabulary is counted at its bound; tolerances.PRESET_ESTIMATE_MAX_*)."""
    torch = pytest.importorskip("torch")  # noqa: F841
    transformers = pytest.importorskip("transformers")
    from masc_engine.export.config_budget import estimate_parameters
    from masc_engine.export.random_models import build_random_checkpoint, preset_config

    build_random_checkpoint(f"random:{preset}", tmp_path)
    cls = transformers.CLIPSegForImageSegmentation if preset.startswith("clipseg") else transformers.AutoModel
    real = sum(p.numel() for p in cls.from_pretrained(tmp_path).parameters())
    est = sum(estimate_parameters(preset_config(f"random:{preset}"))[0].values())
    assert real * (1 - PRESET_ESTIMATE_MAX_UNDER) <= est <= real * (1 + PRESET_ESTIMATE_MAX_OVER), (est, real)


def test_the_worker_freezes_what_it_could_import_and_skips_what_it_could_not(monkeypatch):
    """A library in WORKER_IMPORTS that is not installed (an optional one) is skipped, not an
    error: the worker still imports the others and freezes once (torch_worker
    ``_freeze_library_objects``)."""
    import gc
    import sys

    from masc_engine.export import torch_worker

    frozen = []
    monkeypatch.setattr(gc, "freeze", lambda: frozen.append(True))
    monkeypatch.setattr(torch_worker, "WORKER_IMPORTS", ("masc_no_such_library_installed", "colorsys"))
    monkeypatch.delitem(sys.modules, "colorsys", raising=False)
    torch_worker._freeze_library_objects()
    assert frozen == [True] and "colorsys" in sys.modules
