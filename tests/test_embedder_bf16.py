"""Embedder bundles certified for bf16 on the CPU (``masc-export --precision bf16-cpu`` of CLIP,
DINO, DINOv2): the unit table of each tower, the cosines the gates read, the certification kept or
refused, and the certified bundle run as masc-run runs it.

The certificate gates each pair's image-image cosine (the CP slot: clip_i, dino / 100) and
image-text cosine (the PF slot: clip_t / 100; an image-only embedder repeats the image cosine)
against fp32 ONNX Runtime, with the bf16-cpu gates of tolerances.py.
"""

from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import pytest

pytest.importorskip("openvino", reason="bf16 on the CPU needs the openvino extra")

from masc_engine import tolerances as tol  # noqa: E402
from masc_engine.engine.backends import openvino as ovb  # noqa: E402
from masc_engine.export import cpu_precision as cpc  # noqa: E402
from masc_engine.runtime.embedder import Embedder  # noqa: E402
from masc_engine.runtime.encoder import RunnerSettings  # noqa: E402

needs_bf16 = pytest.mark.skipif(
    not ovb.cpu_supports_bf16(), reason="this CPU has no native bf16 (OpenVINO OPTIMIZATION_CAPABILITIES lacks BF16)"
)


def _pairs(n_images: int, refs: int, seed: int) -> list:
    return cpc.cross_pairs(cpc.synthetic_images(n_images, seed), refs)


@pytest.mark.parametrize(
    "preset, graph, layers", [("clip-tiny", "image", 2), ("clip-tiny", "text", 2), ("dino-tiny-s16", "image", 2)]
)
def test_each_tower_cuts_into_embeddings_layers_and_head(embedder_bundles, preset, graph, layers):
    """CLIP's vision tower has a LayerNorm before its encoder (``pre_layrnorm``): it belongs to the
    embeddings unit, so the first layer starts at that LayerNorm's output."""
    import onnx

    path = embedder_bundles[preset] / f"{graph}.onnx"
    units = cpc.graph_units(path, graph)
    assert units["names"] == [f"{graph}.embeddings", *(f"{graph}.layers.{i}" for i in range(layers)), f"{graph}.head"]
    lns = [n for n in onnx.load(str(path), load_external_data=False).graph.node if n.op_type == "LayerNormalization"]
    first = lns[1] if len(lns) == 2 * layers + 2 else lns[0]
    assert units["boundaries"][0] == first.input[0]
    if preset == "clip-tiny" and graph == "image":
        assert len(lns) == 2 * layers + 2 and units["boundaries"][0] == lns[0].output[0]


@pytest.mark.parametrize("preset", ["clip-tiny", "dino-tiny-s16"])
def test_the_gated_scores_are_the_pairs_cosines(embedder_bundles, preset):
    e = Embedder(embedder_bundles[preset])
    pairs = _pairs(6, 2, 3)
    got = cpc.embedder_scores(e, pairs)
    # the distinct images in one call, in the order the scores embed them (float32 GEMM bits
    # depend on the batch's size)
    distinct = list({id(im): im for p in pairs for im in (p.ref_image, p.out_image)}.values())
    emb = dict(zip(map(id, distinct), e.embed_images(distinct)))
    ref, out = (np.stack([emb[id(getattr(p, side))] for p in pairs]) for side in ("ref_image", "out_image"))
    assert len(distinct) < 2 * len(pairs)  # references repeat: each embedded once
    unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)  # noqa: E731
    np.testing.assert_array_equal(got["cp"], np.sum(unit(ref.astype(np.float64)) * unit(out.astype(np.float64)), 1))
    if e.has_text:
        text = e.embed_texts([p.prompt for p in pairs]).astype(np.float64)
        np.testing.assert_array_equal(got["pf"], np.sum(unit(out.astype(np.float64)) * unit(text), 1))
        assert not np.array_equal(got["pf"], got["cp"])
    else:
        np.testing.assert_array_equal(got["pf"], got["cp"])


def test_a_failing_embedder_is_refused_and_nothing_written(embedder_bundles, tmp_path, monkeypatch):
    bundle = shutil.copytree(embedder_bundles["dino-tiny-s16"], tmp_path / "b")
    before = (bundle / "manifest.json").read_bytes()
    strict = dataclasses.replace(cpc.FIDELITY_GATES, max_abs_dcp=1e-9)  # a gate bf16 cannot meet
    monkeypatch.setattr(cpc, "FIDELITY_GATES", strict)
    if not ovb.cpu_supports_bf16():
        with pytest.raises(ovb.BackendUnavailableError, match="native bf16"):
            cpc.certify_bundle(bundle, calibration=_pairs(8, 3, 5), heldout=_pairs(34, 30, 6), max_keep=0)
        return
    with pytest.raises(cpc.CertificationError, match=r"refused.*max \|dCP\|") as e:
        cpc.certify_bundle(bundle, calibration=_pairs(8, 3, 5), heldout=_pairs(34, 30, 6), max_keep=0)
    assert e.value.report["whole_graph"]["max_abs_dcp"] > strict.max_abs_dcp
    assert (bundle / "manifest.json").read_bytes() == before


def _check_certified(out, fp32) -> None:
    """``out``: a bf16-cpu embedder bundle certified from the fp32 bundle ``fp32``."""
    m = json.loads((out / "manifest.json").read_text())
    rec = m["precision"]
    assert (m["kind"], rec["mode"], rec["backend"], rec["graphs"]) == ("embedder", "bf16-cpu", "openvino", ["image"])
    assert rec["scores"] == cpc.EMBEDDER_SCORES
    held = rec["gates"]["heldout"]
    assert held["pass"] and held["pairs"] >= tol.FIDELITY_MIN_PAIRS
    assert max(held["max_abs_dcp"], held["max_abs_dpf"]) <= tol.FIDELITY_MAX_ABS_DELTA
    for g in m["graphs"]:  # the graphs stay the fp32 export's
        assert (out / m["graphs"][g]["file"]).read_bytes() == (fp32 / m["graphs"][g]["file"]).read_bytes()
    e = Embedder(out)
    assert (e.backend, e.precision) == ("openvino", "bf16-cpu")
    pairs = _pairs(12, 3, 11)
    test, ref = cpc.embedder_scores(e, pairs), cpc.embedder_scores(Embedder(fp32), pairs)
    for k in ("cp", "pf"):
        assert np.max(np.abs(test[k] - ref[k])) <= tol.FIDELITY_MAX_ABS_DELTA
    assert not np.array_equal(test["cp"], ref["cp"])  # bf16 ran: not fp32's bits
    assert Embedder(fp32, RunnerSettings(backend="openvino")).precision == "fp32"  # uncertified: f32


@needs_bf16
@pytest.mark.slow
def test_masc_export_certifies_an_embedder_that_then_runs_in_bf16(embedder_bundles, tmp_path):
    """The command exports the fp32 graphs and certifies them; Embedder(bundle) then runs them on
    OpenVINO with the certified units in bf16, its cosines on other pairs within the gates."""
    from click.testing import CliRunner

    from masc_engine.cli.export_cmd import main

    out = tmp_path / "dino"
    res = CliRunner().invoke(main, ["--model", "random:dino-tiny-s16", "--out", str(out), "--precision", "bf16-cpu"])
    assert res.exit_code == 0, res.output[-3000:]
    _check_certified(out, embedder_bundles["dino-tiny-s16"])


@needs_bf16
@pytest.mark.slow
def test_clip_is_certified_with_its_image_and_text_cosines(embedder_bundles, tmp_path, monkeypatch):
    """CLIP's towers on the same path (the pre-encoder LayerNorm in the embeddings unit; the PF slot
    is the image-text cosine). The candidates compile in memory: the certification leaves OpenVINO's
    compiled-model cache empty (each candidate is a manifest no later process would import); the
    certified bundle, run after, fills it."""
    root = tmp_path / "cache-root"
    monkeypatch.setenv("MASC_ENGINE_CACHE", str(root))
    compiled = root / "runtime" / "openvino"
    out = shutil.copytree(embedder_bundles["clip-tiny"], tmp_path / "clip")
    rec = cpc.certify_bundle(out)
    assert rec["search"]["whole_graph"]["max_abs_dpf"] != rec["search"]["whole_graph"]["max_abs_dcp"]
    assert not compiled.exists() or not list(compiled.iterdir())
    _check_certified(out, embedder_bundles["clip-tiny"])
    assert len(list(compiled.iterdir())) >= 1
