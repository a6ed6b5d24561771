"""Edges of the cut CLIP text runs and of the OpenVINO graph import that the main suites leave open.

- A text graph whose sequence axis is fixed at 77 runs every prompt padded to 77, even when the
  manifest's text section names a pooling rule (only a dynamic axis lets a prompt run cut).
- An exported CLIP whose end-of-text id is not the legacy 2 records that id in the text section
  (``eos_token_id``): its prompts are then cut after their end-of-text token, at validation and at
  run time, instead of all running the whole 77-token context.
- An OpenVINO graph compiled whole with a compiled-model cache keeps the precision and the thread
  count it was asked for, on the first compile and on the cache hit.
- A graph cut into segments has the whole graph's input and output names (a later segment can take
  a graph input the first does not), and its outputs come back under those names.
- bench/gate_distributions.py refuses gates other than bf16-cpu for an embedder shape, and every
  NaFlex result file records the int8 figures of each initialisation (int8 is optional for the
  embedder files alone).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import warnings

import numpy as np
import pytest

from masc_engine.engine.manifest import write_manifest
from masc_engine.export.random_models import EMBEDDER_PRESETS
from masc_engine.runtime.embedder import Embedder, text_run_lengths
from masc_engine.tolerances import EMBEDDER_RUNTIME_FAKE_RTOL
from support import REPO
from test_embedder_runtime import CONTEXT, _rel, make_fake_embedder
from test_gates_distributions import GATE_FILES, RESULTS

try:  # the OpenVINO core is made at import, as tests/test_openvino_backend.py makes it
    from masc_engine.engine.backends import openvino as ovb

    HAS_BF16 = ovb.cpu_supports_bf16()
except ImportError:  # no openvino: its tests skip, the others run
    ovb, HAS_BF16 = None, False

# ---------------------------------------------------------------------------------- texts


def test_a_fixed_77_text_graph_runs_padded_whatever_its_pooling_rule(tmp_path):
    """The fake text graph sums every token it is given: a prompt run cut would lose the padding's
    rows from its sum (and a fixed-77 graph refuses a shorter input)."""
    out = tmp_path / "b"
    weights = make_fake_embedder(out)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["text"].update(pooling="first eos_token_id", eos_token_id=1)
    write_manifest(out, {**manifest, "files": list(manifest["files"])})
    texts = ["a photo of a dog", "cat"]
    with Embedder(out) as e:
        assert not e.text_sequence_dynamic
        got = e.embed_texts(texts)
        ids, _ = e.tokenize(texts)
    assert text_run_lengths(ids, manifest["text"]).tolist() == [16, 16]  # what a dynamic graph would run
    want = weights["table"][ids].astype(np.float64).sum(axis=1)  # all 77 tokens, padding included
    assert ids.shape == (2, CONTEXT) and _rel(got, want) <= EMBEDDER_RUNTIME_FAKE_RTOL


@pytest.mark.slow
def test_a_clip_with_a_non_legacy_end_of_text_id_records_it_and_runs_cut(tmp_path):
    """random:clip-tiny with its text config's ``eos_token_id`` set to the tokenizer's end-of-text
    id (as in current CLIP checkpoints): pooled at the first end-of-text token, recorded, cut."""
    pytest.importorskip("torch", reason="exporting needs the export extra (torch)")
    pytest.importorskip("transformers")
    from masc_engine.export.checkpoint import random_checkpoint_dir
    from masc_engine.export.embedders import export_embedder_bundle

    ckpt = tmp_path / "ckpt"
    shutil.copytree(random_checkpoint_dir("random:clip-tiny"), ckpt)
    eos = json.loads((ckpt / "tokenizer_config.json").read_text())["eos_token"]
    eos = eos if isinstance(eos, str) else eos["content"]
    eos_id = json.loads((ckpt / "tokenizer.json").read_text())["model"]["vocab"][eos]
    assert eos_id != 2
    config = json.loads((ckpt / "config.json").read_text())
    config["text_config"]["eos_token_id"] = eos_id
    (ckpt / "config.json").write_text(json.dumps(config))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = export_embedder_bundle(str(ckpt), tmp_path / "bundle")
    m = json.loads((out / "manifest.json").read_text())
    assert (m["text"]["pooling"], m["text"]["eos_token_id"]) == ("first eos_token_id", eos_id)
    assert type(m["text"]["eos_token_id"]) is int
    cases = m["validation"]["text"]["cases"]
    assert [c.get("cut_to") for c in cases] == [None, [16], None, [16, 32, 16]]
    with Embedder(out) as e:
        ids, _ = e.tokenize(["dog", "a red backpack in the snow"])
        assert e.text_sequence_dynamic
        assert text_run_lengths(ids, e.bundle.manifest["text"]).tolist() == [16, 16]


# ---------------------------------------------------------------------------------- OpenVINO graphs


def _ov():
    if ovb is None:
        pytest.skip("the OpenVINO backend's tests need openvino (the [openvino] extra)")
    return ovb


def _vision(naflex_bundle):
    from masc_engine.engine.bundle import Bundle

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Bundle(naflex_bundle).graph_file("vision")


def test_a_cached_whole_graph_keeps_the_thread_count_asked_for(naflex_bundle, tmp_path):
    _ov()
    path, cache = _vision(naflex_bundle), tmp_path / "cache"
    default = ovb.OpenVINORunner(path, "vision").threads
    if default < 2:
        pytest.skip("one core: no thread count other than the default to ask for")
    asked = default - 1
    assert ovb.OpenVINORunner(path, "vision", threads=asked).threads == asked
    first = ovb.OpenVINORunner(path, "vision", threads=asked, cache_dir=cache)
    assert list(cache.glob("*.blob"))
    second = ovb.OpenVINORunner(path, "vision", threads=asked, cache_dir=cache)
    assert (first.threads, second.threads) == (asked, asked)


def test_a_cached_whole_graph_is_compiled_in_the_precision_asked_for(naflex_bundle, tmp_path):
    _ov()
    if not HAS_BF16:
        pytest.skip("this CPU has no native bf16 (OpenVINO OPTIMIZATION_CAPABILITIES lacks BF16)")
    path, cache = _vision(naflex_bundle), tmp_path / "cache"
    for _ in range(2):  # the compile, then the cache hit
        r = ovb.OpenVINORunner(path, "vision", precision="bf16", cache_dir=cache)
        (seg,) = r.runtime_summary()
        assert r.precision == "bf16" and seg["hint"] == "bf16"
        assert sum(n for k, n in seg["runtime"].items() if k.endswith(":bf16")) > 0, seg["runtime"]


def test_a_graph_cut_into_segments_has_the_whole_graphs_names(naflex_bundle):
    _ov()
    from masc_engine.export import cpu_precision as cpc

    path = _vision(naflex_bundle)
    units = cpc.graph_units(path, "vision")
    bounds = [None] + units["boundaries"] + [None]
    segs = [ovb.Segment("f32", bounds[j], bounds[j + 1], (u,)) for j, u in enumerate(units["names"])]
    cut = ovb.OpenVINORunner(path, "vision", segments=segs)
    whole = ovb.OpenVINORunner(path, "vision")
    assert cut.input_names == whole.input_names and "pixel_attention_mask" in cut.input_names
    assert cut.output_names == whole.output_names
    assert not set(cut.output_names) & set(units["boundaries"])
    rng = np.random.default_rng(0)
    feeds = {
        "pixel_values": rng.normal(size=(1, 16, 768)).astype(np.float32),
        "pixel_attention_mask": np.ones((1, 16), np.int32),
        "position_weights": (rng.random((1, 16, 256)) / 20).astype(np.float32),
    }
    assert sorted(cut.run(feeds)) == sorted(whole.output_names)


# ---------------------------------------------------------------------------------- gate results


def _gate_bench():
    spec = importlib.util.spec_from_file_location("gate_distributions", REPO / "bench" / "gate_distributions.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("gates", [("bf16-cpu", "int8"), ("fp16",)])
def test_an_embedder_shape_refuses_gates_other_than_bf16_cpu(tmp_path, gates):
    pytest.importorskip("torch", reason="the embedder export needs the export extra (torch)")
    bench = _gate_bench()
    with pytest.raises(SystemExit, match="bf16-cpu gates only"):
        bench._embedder_row(tmp_path / "ckpt", tmp_path, {}, gates)
    assert not list(tmp_path.iterdir())  # refused before exporting anything


@pytest.mark.parametrize("name", GATE_FILES)
def test_int8_figures_are_recorded_for_every_naflex_initialisation(name):
    runs = json.loads((RESULTS / name).read_text())["runs"]
    if GATE_FILES[name][0] in EMBEDDER_PRESETS:
        assert all("int8" not in r for r in runs)
    else:
        assert runs and all({"kept", "max_abs_dcp", "spearman_cp", "spearman_pf"} <= set(r["int8"]) for r in runs)
