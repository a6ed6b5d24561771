"""FP8 (E4M3 explicit Q/DQ) vision towers: the graph, its numerics on ONNX Runtime CPU, the
Q/DQ placement the fake TensorRT 11 requires, and the certification that keeps or refuses it
(export/fp8.py).

What these tests cannot show: FP8 speed, or that TensorRT's FP8 kernels give the numbers ONNX
Runtime's emulation gives (docs/verification.md: unverified on a GPU).
"""

from __future__ import annotations

import re
import sys

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from doubles import fake_tensorrt
from masc_engine.engine.bundle import Bundle
from masc_engine.export import fp8
from masc_engine.export.cpu_precision import CertificationError, cross_pairs, synthetic_images
from masc_engine.tolerances import (
    BATCH_INVARIANCE_ATOL,
    FIDELITY_MAX_ABS_DELTA,
    FP8_E4M3_MAX,
    FP8_OPSET,
    FP8_TINY_TOKEN_REL_ERROR_MAX,
)


@pytest.fixture(scope="module")
def calibrated(naflex_bundle):
    """The tiny bundle's vision graph (weights loaded) and its calibration figures on 16 pairs."""
    b = Bundle(naflex_bundle)
    amax = fp8.calibrate(b, cross_pairs(synthetic_images(8, 1), 2))
    return onnx.load(str(b.graph_file("vision"))), amax


def test_fp8_graph_puts_e4m3_qdq_around_every_linear_layer(calibrated, tmp_path):
    model, amax = calibrated
    sites = fp8.linear_sites(model)
    assert len(sites) == 13  # patch embedding + 2 layers x (q, k, v, out, fc1, fc2)
    assert fp8.unit_names(sites) == ["vision.embeddings", "vision.layers.0", "vision.layers.1"]
    assert all(a > 0 for a in amax.values()) and amax["pixel_values"] == pytest.approx(1.0, abs=0.02)
    q = fp8.qdq_model(model, amax)
    onnx.checker.check_model(q, full_check=True)
    assert max(o.version for o in q.opset_import if o.domain in ("", "ai.onnx")) == FP8_OPSET
    ops = [n.op_type for n in q.graph.node]
    assert ops.count("QuantizeLinear") == 13 and ops.count("DequantizeLinear") == 26
    inits = {t.name: t for t in q.graph.initializer}
    for s in sites:  # weights stored in E4M3 with one scale per output channel; activations per tensor
        w = inits[f"{s['node']}.w_fp8"]
        assert w.data_type == onnx.TensorProto.FLOAT8E4M3FN
        assert list(inits[f"{s['node']}.w_scale"].dims) == [w.dims[1]]
        xs = onnx.numpy_helper.to_array(inits[f"{s['node']}.x_scale"])
        assert xs.shape == () and xs == np.float32(amax[s["act"]] / FP8_E4M3_MAX)
    assert not any(
        t.data_type == onnx.TensorProto.FLOAT and len(t.dims) == 2 and t.name in {s["weight"] for s in sites}
        for t in q.graph.initializer
    )  # the fp32 copies of quantized weights are gone


def test_fp8_graph_runs_on_onnxruntime_cpu_close_to_fp32(calibrated, naflex_bundle):
    """ONNX Runtime's CPU provider runs the float8 Q/DQ: the tokens move (E4M3 has 3 mantissa
    bits) but stay near fp32; keeping every unit in fp32 gives fp32's tokens exactly."""
    import onnxruntime as ort

    from masc_engine.runtime.scorer import Scorer

    model, amax = calibrated
    scorer = Scorer(Bundle(naflex_bundle), graph_variant="portable")
    real, captured = scorer.vision, []

    class Spy:  # the vision feeds the scorer makes for two real pairs
        def __getattr__(self, k):
            return getattr(real, k)

        def run(self, feeds):
            captured.append(feeds)
            return real.run(feeds)

    scorer.vision = Spy()
    scorer.score_batch(cross_pairs(synthetic_images(2, 5), 1))
    feeds = captured[0]
    ref_sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ref = ref_sess.run(None, feeds)[0]

    def run(m):
        return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]

    got = run(fp8.qdq_model(model, amax))
    rel = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    assert 0 < rel < FP8_TINY_TOKEN_REL_ERROR_MAX, rel
    kept = run(fp8.qdq_model(model, amax, keep_units=fp8.unit_names(fp8.linear_sites(model))))
    np.testing.assert_array_equal(kept, ref)


# ------------------------------------------------------------------ TensorRT 11's explicit quantization (fake)


@pytest.fixture
def fake_trt(monkeypatch, tmp_path):
    from masc_engine.engine.backends import tensorrt as trt_backend

    monkeypatch.setitem(sys.modules, "tensorrt", fake_tensorrt.make_module())
    monkeypatch.setattr(trt_backend, "CupyDevice", fake_tensorrt.NumpyDevice)
    monkeypatch.setenv("MASC_ENGINE_CACHE", str(tmp_path / "cache"))
    fake_tensorrt.reset()
    yield trt_backend
    fake_tensorrt.reset()


def _mutate(q, what: str):
    """One Q/DQ placement TensorRT 11 does not take, made in ``q`` (the first linear layer's)."""
    from onnx import TensorProto, helper, numpy_helper

    g = q.graph
    inits = {t.name: t for t in g.initializer}
    node = {n.name: n for n in g.node}
    tag = next(n.name[: -len(".x_quant")] for n in g.node if n.name.endswith(".x_quant"))
    if what == "q_feeds_matmul":  # the activation's Q straight into the MatMul (no DQ)
        mm = next(n for n in g.node if f"{tag}.x_dq" in n.input)
        mm.input[0] = f"{tag}.x_q"
    elif what == "per_channel_activation":
        t = inits[f"{tag}.x_scale"]
        t.CopyFrom(numpy_helper.from_array(np.full(768, numpy_helper.to_array(t), np.float32), t.name))
    elif what == "weight_axis_0":
        dq = node[f"{tag}.w_dequant"]
        dq.attribute[0].i = 0
    elif what == "e5m2":
        t = inits["vision.fp8.zero"]
        t.CopyFrom(helper.make_tensor(t.name, TensorProto.FLOAT8E5M2, [], [0]))
    return q


@pytest.mark.parametrize(
    "what,why",
    [
        ("q_feeds_matmul", r"QuantizeLinear '.*x_quant': its output feeds an op other than DequantizeLinear"),
        ("per_channel_activation", r"an activation takes one scale per tensor, not \[768\]"),
        (
            "weight_axis_0",
            r"per-channel weight scales must run along the MatMul's output channels \(axis 1\), not axis 0",
        ),
        ("e5m2", r"zero point must be an INT8 or FLOAT8E4M3FN constant"),
    ],
)
def test_the_fake_tensorrt_takes_the_fp8_graph_and_refuses_wrong_placements(
    fake_trt, calibrated, naflex_bundle, tmp_path, what, why
):
    from masc_engine.engine.backends.tensorrt import EngineBuildError

    model, amax = calibrated
    from masc_engine.engine.backends import trt_profiles as tp

    manifest = Bundle(naflex_bundle).manifest
    profile = tp.profile_shapes(manifest["graphs"]["vision"], tp.default_axis_ranges(manifest, max_batch=2))
    onnx.save(fp8.qdq_model(model, amax), str(tmp_path / "v.onnx"))
    fake_trt.build_engine(tmp_path / "v.onnx", tmp_path / "v.engine", "fp8", [profile])
    assert not fake_tensorrt.BUILD_ERRORS
    onnx.save(_mutate(fp8.qdq_model(model, amax), what), str(tmp_path / "bad.onnx"))
    with pytest.raises(EngineBuildError, match="failed to build engine 'bad'"):
        fake_trt.build_engine(tmp_path / "bad.onnx", tmp_path / "bad.engine", "fp8", [profile])
    assert any(re.search(why, e) for e in fake_tensorrt.BUILD_ERRORS), fake_tensorrt.BUILD_ERRORS


# ------------------------------------------------------------------ certification


def test_fp8_needs_enough_held_out_pairs(naflex_bundle, tmp_path):
    few = cross_pairs(synthetic_images(4, 3), 1)
    with pytest.raises(CertificationError, match=r"fp8 needs at least 1000 held-out pairs .* has 4"):
        fp8.certify_fp8(naflex_bundle, tmp_path / "out", calibration=few, heldout=few)
    assert not (tmp_path / "out").exists()


@pytest.fixture
def small_gates(monkeypatch):
    """Held-out sets of 30 pairs count (the gates' size rule, not their thresholds, is relaxed)."""
    from masc_engine.export import cpu_precision

    monkeypatch.setattr(cpu_precision, "FIDELITY_MIN_PAIRS", 30)
    monkeypatch.setattr(fp8, "FIDELITY_MIN_PAIRS", 30)


def test_fp8_is_refused_with_figures_where_the_gates_fail(naflex_bundle, tmp_path, small_gates):
    """The tiny random model in whole-graph FP8 misses the 2e-3 gates; with no unit allowed in
    fp32 the export is refused in one line with the figures, and nothing is written."""
    cal, held = cross_pairs(synthetic_images(8, 1), 2), cross_pairs(synthetic_images(12, 2), 3)
    with pytest.raises(CertificationError) as e:
        fp8.certify_fp8(naflex_bundle, tmp_path / "out", calibration=cal, heldout=held, max_keep=0)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("fp8 refused: no plan with at most 0 of 3 units in fp32 passes the gates")
    assert "(whole graph in fp8: " in msg and "bf16" not in msg
    dcp = float(re.search(r"max \|dCP\| ([0-9.e+-]+)", msg).group(1))
    assert dcp > FIDELITY_MAX_ABS_DELTA
    assert list(tmp_path.iterdir()) == []  # no bundle, no staging folder left


def test_fp8_never_removes_a_folder_beside_its_output(naflex_bundle, tmp_path, small_gates):
    """A folder the user keeps beside ``out`` under the name a fixed staging folder would have
    survives a refused (or written) FP8 export: the stage is a fresh folder of its own."""
    kept = tmp_path / "out.fp8-stage"
    kept.mkdir()
    (kept / "notes.md").write_text("mine")
    cal, held = cross_pairs(synthetic_images(8, 1), 2), cross_pairs(synthetic_images(12, 2), 3)
    with pytest.raises(CertificationError):
        fp8.certify_fp8(naflex_bundle, tmp_path / "out", calibration=cal, heldout=held, max_keep=0)
    assert (kept / "notes.md").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.fp8-stage"]


def test_a_certified_fp8_bundle_is_written_and_scores(naflex_bundle, tmp_path, small_gates, caplog):
    """Where the gates pass (here: units kept in fp32 by the search until they do), the bundle is
    written with the FP8 vision graph, its manifest records the plan and the figures, and masc-run's
    scorer loads it and gives the certified scores."""
    from masc_engine.runtime.scorer import Scorer

    cal, held = cross_pairs(synthetic_images(8, 1), 2), cross_pairs(synthetic_images(12, 2), 3)
    with caplog.at_level("INFO", logger="masc_engine"):
        rec = fp8.certify_fp8(naflex_bundle, tmp_path / "out", calibration=cal, heldout=held, max_keep=3)
    b = Bundle(tmp_path / "out", verify="all")
    assert b.precision == "fp8" and b.manifest["precision"] == rec
    lines = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("fp8 whole graph, calibration: ") for m in lines) and not any("bf16" in m for m in lines)
    assert rec["gates"]["heldout"]["pass"] and rec["gates"]["heldout"]["pairs"] == 36
    assert rec["quantized_matmuls"] == sum(
        s["unit"] not in rec["keep_fp32"] for s in fp8.linear_sites(onnx.load(str(naflex_bundle / "vision.onnx")))
    )
    g = onnx.load(str(b.graph_file("vision")), load_external_data=False)
    onnx.checker.check_model(onnx.load(str(b.graph_file("vision"))), full_check=True)
    assert b.manifest["graphs"]["vision"]["file"] == "vision.fp8.onnx" and "variants" not in b.manifest
    assert not (tmp_path / "out" / "vision.ort-cpu.onnx").exists()
    got = Scorer(b).score_batch(held[:4])
    ref = Scorer(Bundle(naflex_bundle)).score_batch(held[:4])
    d = max(abs(a.cp - r.cp) for a, r in zip(got, ref))
    assert d <= rec["gates"]["heldout"]["max_abs_dcp"] + BATCH_INVARIANCE_ATOL  # other batches than the gates
    assert any(n.op_type == "QuantizeLinear" for n in g.graph.node) == (rec["quantized_matmuls"] > 0)


def test_masc_export_fp8_refusal_is_one_line(naflex_bundle, tmp_path):
    from masc_engine.cli.export_cmd import main

    res = CliRunner().invoke(
        main,
        [
            "--out",
            str(tmp_path / "o"),
            "--precision",
            "fp8",
            "--fp32-bundle",
            str(naflex_bundle),
            "--backend",
            "tensorrt",
        ],
    )
    assert res.exit_code != 0 and "--precision fp8 makes an ONNX bundle certified on CPU" in res.output
