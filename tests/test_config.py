"""The scorer's one home for its settings (runtime/config.py ScorerConfig), the backend registry
(engine/backends/registry.py) and the one option group masc-run, masc-rank and masc-serve share."""

from __future__ import annotations

import ast
import hashlib
import json
import pickle
from pathlib import Path

import pytest

from masc_engine import Scorer
from masc_engine.cli.options import SCORER_PARAMS, scorer_config
from masc_engine.engine.backends.registry import BACKENDS, get_backend
from masc_engine.errors import BackendUnavailableError
from masc_engine.jobs.pairs import RunSettings, encoding_namespace
from masc_engine.runtime.config import ScorerConfig

SRC = Path(__file__).resolve().parents[1] / "src" / "masc_engine"


def test_resolve_fills_every_choice_from_the_bundle(naflex_bundle):
    c = Scorer(naflex_bundle).config
    m = json.loads((naflex_bundle / "manifest.json").read_text())
    assert (c.backend, c.provider, c.graph_variant) == ("onnxruntime", "cpu", "ort-cpu")
    assert c.fg_threshold == m["scoring"]["fg_threshold"] and c.naflex_max_patches == m["image"]["max_num_patches"]
    assert (c.device_resident, c.cp_head, c.precision) == (False, "numpy", "fp32")
    assert c.options == {"ort_memory": "lean"}  # the backend's default option, filled in
    # Resolving again changes nothing: a resolved config is a fixed point (what Ray workers receive).
    assert c.resolve(Scorer(naflex_bundle).bundle).replace(precision="fp32") == c


def test_journal_fingerprint_and_cache_namespace_are_the_ones_masc_run_always_wrote(naflex_bundle):
    """Journals and caches written before the settings had one home stay valid: the fingerprint and
    the store's namespace hash the same keys and values as before."""
    s = Scorer(naflex_bundle, stripper="none", naflex_max_patches=64)
    settings = RunSettings(exif="ignore")
    # The run settings as journals have always hashed them (fields added later enter only when set).
    run = {
        "exif": "ignore",
        "min_reference_mask_frac": None,
        "min_output_mask_frac": None,
        "mask_size_tolerance": 0,
        "baselines": False,
        "save_maps": None,
    }
    old = {
        "run": run,
        "bundle": s.bundle.fingerprint,
        "stripper": "none",
        "fg_threshold": 0.5,
        "budget": 64,
        "provider": "cpu",
        "cp_head": "numpy",
        "backend": "onnxruntime",
        "precision": "fp32",
        "graph_variant": "ort-cpu",
    }
    assert settings.fingerprint(s) == hashlib.sha256(json.dumps(old, sort_keys=True).encode()).hexdigest()[:16]
    assert encoding_namespace(s, "ignore") == {
        "bundle": s.bundle.fingerprint,
        "budget": 64,
        "exif": "ignore",
        "provider": "cpu",
        "backend": "onnxruntime",
        "precision": "fp32",
        "graph_variant": "ort-cpu",
    }


def test_identity_changes_with_every_setting_that_changes_a_score(naflex_bundle):
    base = Scorer(naflex_bundle).config
    for change in (
        {"stripper": "none"},
        {"fg_threshold": 0.4},
        {"naflex_max_patches": 32},
        {"graph_variant": "portable"},
        {"cp_head": "graph"},
    ):
        assert base.replace(**change).identity() != base.identity(), change
    for same in ({"batch_size": 3}, {"intra_op_threads": 1}, {"backend_options": {"ort_memory": "arena"}}):
        assert base.replace(**same).identity() == base.identity(), same  # results do not depend on these


def test_config_is_frozen_hashable_and_picklable():
    c = ScorerConfig(stripper="none", backend_options={"ort_memory": "arena"})
    assert pickle.loads(pickle.dumps(c)) == c and hash(c) == hash(pickle.loads(pickle.dumps(c)))
    with pytest.raises(AttributeError):
        c.stripper = "regex"
    assert c.options == {"ort_memory": "arena"}


@pytest.mark.parametrize(
    "kwargs, err",
    [
        ({"stripper": "spacey"}, ValueError),
        ({"batch_size": 0}, ValueError),
        ({"batch_size": 2.0}, TypeError),
        ({"fg_threshold": 1.5}, ValueError),
        ({"cp_head": "torch"}, ValueError),
        ({"device_resident": True, "cp_head": "numpy"}, ValueError),
        ({"provider": 3}, TypeError),
    ],
)
def test_bad_settings_are_refused_before_any_bundle_is_read(kwargs, err):
    with pytest.raises(err):
        ScorerConfig(**kwargs)
    with pytest.raises(err):
        Scorer("/nonexistent/bundle", **kwargs)  # the settings first, not a missing bundle


def test_scorer_takes_a_config_or_its_fields_alike(naflex_bundle):
    by_config = Scorer(naflex_bundle, ScorerConfig(stripper="none", batch_size=2)).config
    by_keywords = Scorer(naflex_bundle, stripper="none", batch_size=2).config
    assert by_config == by_keywords
    with pytest.raises(TypeError, match="unexpected setting"):
        Scorer(naflex_bundle, strippr="none")


def test_a_backend_option_belongs_to_its_backend(naflex_bundle):
    assert Scorer(naflex_bundle, ort_memory="arena").config.options == {"ort_memory": "arena"}
    with pytest.raises(ValueError, match="ort_memory must be one of"):
        Scorer(naflex_bundle, ort_memory="huge")
    with pytest.raises(ValueError, match="takes no option ort_memory"):
        ScorerConfig(backend="openvino", backend_options={"ort_memory": "lean"}).resolve(Scorer(naflex_bundle).bundle)


def test_registry_names_every_backend_and_refuses_others():
    assert list(BACKENDS) == ["onnxruntime", "tensorrt", "openvino"]
    assert get_backend("tensorrt").is_gpu() and get_backend("onnxruntime").is_gpu("cuda")
    assert not get_backend("onnxruntime").is_gpu("cpu") and not get_backend("openvino").is_gpu()
    with pytest.raises(BackendUnavailableError, match="available: onnxruntime, tensorrt, openvino"):
        get_backend("nonesuch")


def test_nothing_above_the_engine_branches_on_a_backend_name():
    """Backends are chosen through the registry: no ``backend == "..."`` test above engine/.
    (masc-export's ``--backend onnx|tensorrt`` names what to build, not a runtime backend.)"""
    names = set(BACKENDS)
    offenders = []
    for layer in ("runtime", "jobs", "serve", "cli", "report", "metrics"):
        for path in (SRC / layer).rglob("*.py"):
            if path.name == "export_cmd.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Compare) and any(
                    isinstance(c, ast.Constant) and c.value in names for c in [node.left, *node.comparators]
                ):
                    offenders.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert not offenders, offenders


def _params(command) -> dict:
    return {p.name: p for p in command.params}


def test_masc_run_rank_and_serve_take_the_same_scorer_options():
    from masc_engine.cli.rank_cmd import main as rank
    from masc_engine.cli.run_cmd import main as run
    from masc_engine.cli.serve_cmd import main as serve

    for cmd in (run, rank, serve):
        params = _params(cmd)
        assert set(SCORER_PARAMS) <= set(params), cmd.name
        for name in SCORER_PARAMS:  # the very same definition: type, default and help
            mine, theirs = params[name], _params(run)[name]
            assert (mine.opts, mine.default, mine.help, str(mine.type)) == (
                theirs.opts,
                theirs.default,
                theirs.help,
                str(theirs.type),
            ), (cmd.name, name)


def test_the_option_group_builds_the_config():
    params = {k: None for k in SCORER_PARAMS} | {
        "backend": "auto",
        "graph_variant": "auto",
        "stripper": "none",
        "batch_size": 4,
        "threads": 0,
        "ort_memory": "arena",
        "other": 1,
    }
    c = scorer_config(params)
    assert c == ScorerConfig(stripper="none", batch_size=4, backend_options={"ort_memory": "arena"})
    assert params == {"other": 1}  # the group's keys are taken out, the command's own stay
