"""Mixed-precision bundles: the fp32-island policy, the export-time transform pipeline,
the fp16 bundle against masc-metric 0.3.0 (fp32 torch, same weights), bf16 (real graph and its CPU
emulation), and the refusal of a checkpoint whose fp16 graphs fail their gates.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from PIL import Image

from doubles.exported_graphs import graphs_from
from support import REPO, checkpoint_dir, oracle_for, read_rows
from masc_engine.engine.bundle import Bundle
from masc_engine.errors import BackendUnavailableError, ExportValidationError
from masc_engine.export import precision as prec
from masc_engine.export.transforms import run_transforms, variant_file
from masc_engine.tolerances import (
    FIDELITY_MAX_ABS_DELTA,
    FIDELITY_MIN_EMBEDDING_COSINE,
    FIDELITY_MIN_SPEARMAN,
    REDUCED_TOKEN_COSINE_MEDIAN,
    REDUCED_TOKEN_COSINE_P001,
)

onnx = pytest.importorskip("onnx")


def _nodes(path):
    return prec.graph_nodes(onnx.load(str(path)))


def test_policy_on_the_exported_vision_graph(naflex_bundle):
    nodes = _nodes(naflex_bundle / "vision.onnx")
    keep = prec.fp32_onnx_nodes(nodes)
    ops = {op for name, op, _ in nodes if name in keep}
    assert {"LayerNormalization", "Softmax", "Pow", "Tanh", "Cast"} <= ops  # LN, softmax, tanh-GELU, the mask cast
    assert "MatMul" not in ops
    assert sum(op == "LayerNormalization" for _, op, _ in nodes) == 5  # opset >= 17: one node per LN
    gelu_mul = [name for name, op, fx in nodes if op == "Mul" and "aten.gelu" in fx]
    assert gelu_mul and all(n in keep for n in gelu_mul)
    assert "node__to_copy" in keep  # the exporter's mask cast (a converted one breaks loading)


def test_fp16_bundle_records_precision_policy_and_transforms(fp16_bundle, naflex_bundle):
    m = json.loads((fp16_bundle / "manifest.json").read_text())
    assert m["precision"]["mode"] == "fp16" and m["precision"]["policy"] == prec.policy()
    assert m["precision"]["graphs"] == ["vision", "pool", "text", "cp"]
    pg = m["precision"]["pair_gates"]
    assert pg["max_abs_dcp"] <= FIDELITY_MAX_ABS_DELTA and pg["max_abs_dpf"] <= FIDELITY_MAX_ABS_DELTA
    recs = {r["graph"]: r for r in m["transforms"]}
    assert set(recs) == {"vision", "pool", "text", "cp"}
    assert all(
        r["transform"] == "precision-fp16" and r["gates"] == "fp16" and r["variant"] is None for r in recs.values()
    )
    v = recs["vision"]
    assert v["nodes_after"] > v["nodes_before"]  # Casts at the islands' borders
    assert (
        v["validation"]["cos_median"] >= REDUCED_TOKEN_COSINE_MEDIAN
        and v["validation"]["cos_p001"] >= REDUCED_TOKEN_COSINE_P001
    )
    assert recs["pool"]["validation"]["cos_min"] >= FIDELITY_MIN_EMBEDDING_COSINE
    # Most of the vision graph's weights are fp16; the graph's I/O types are the fp32 bundle's.
    assert prec.graph_precision(fp16_bundle / "vision.onnx") == "fp16"
    dt = prec.initializer_dtypes(fp16_bundle / "vision.onnx")
    assert dt["float16"]["elements"] / sum(c["elements"] for c in dt.values()) > 0.95
    b16, b32 = Bundle(fp16_bundle), Bundle(naflex_bundle)
    assert b16.precision == "fp16" and b32.precision == "fp32"
    for g in ("vision", "pool", "text", "cp"):
        r16, r32 = b16.runner(g), b32.runner(g)
        assert r16.precision == "fp16"
        io = lambda r: [(a.name, a.type) for a in r.session.get_inputs() + r.session.get_outputs()]  # noqa: E731
        assert io(r16) == io(r32)
    with pytest.raises(BackendUnavailableError, match="holds fp16 graphs.*--precision fp32"):
        b16.runner("cp", precision="fp32")


def _odd_size_pairs(photo_dir, tmp_path, n=24):
    """Real DreamBooth pairs (the photo_dir fixture: the shipped examples, the shared set when present),
    each image (and its mask) cropped and resized to an odd size (bench/workloads.py, the generator
    bench/precision_cli_check.py uses too)."""
    import sys

    sys.path.insert(0, str(REPO / "bench"))
    from workloads import odd_size_pairs

    return odd_size_pairs(read_rows(photo_dir)[:n], photo_dir, tmp_path)


def test_fp16_bundle_matches_the_fp32_oracle_on_odd_sized_photos(fp16_bundle, naflex_bundle, photo_dir, tmp_path):
    """masc-run on the fp16 bundle vs masc-metric 0.3.0 (fp32 torch, same random weights): per-pair
    |dCP|, |dPF| within the fp16 gate, rankings (Spearman) kept."""
    from click.testing import CliRunner
    from scipy.stats import spearmanr

    from masc_engine.cli.run_cmd import main

    assert checkpoint_dir(fp16_bundle) == checkpoint_dir(naflex_bundle)
    pairs_csv, rows = _odd_size_pairs(photo_dir, tmp_path)
    out = tmp_path / "scores.csv"
    res = CliRunner().invoke(main, [str(pairs_csv), "--bundle", str(fp16_bundle), "--out", str(out), "--no-progress"])
    assert res.exit_code == 0, res.output
    ours = read_rows(tmp_path, "scores.csv")
    oracle = oracle_for(naflex_bundle)
    cp_o, pf_o, cp_r, pf_r = [], [], [], []
    for row, got in zip(rows, ours, strict=True):
        args = [
            Image.open(tmp_path / row["ref_image"]),
            np.array(Image.open(tmp_path / row["ref_mask"])),
            Image.open(tmp_path / row["out_image"]),
            np.array(Image.open(tmp_path / row["out_mask"])),
        ]
        ref = oracle.score(*args, row["prompt"], row["object_name"])
        if np.isnan(ref.cp):
            assert got["cp"] in ("", "nan", "NaN")
            continue
        cp_o.append(float(got["cp"]))
        pf_o.append(float(got["pf"]))
        cp_r.append(ref.cp)
        pf_r.append(ref.pf)
    assert len(cp_o) >= 20
    d_cp = np.abs(np.array(cp_o) - cp_r).max()
    d_pf = np.abs(np.array(pf_o) - pf_r).max()
    assert d_cp <= FIDELITY_MAX_ABS_DELTA and d_pf <= FIDELITY_MAX_ABS_DELTA, (d_cp, d_pf)
    assert d_cp > 0  # really the fp16 graphs (fp32 bundles agree to ~1e-7)
    assert spearmanr(cp_o, cp_r).statistic >= FIDELITY_MIN_SPEARMAN
    assert spearmanr(pf_o, pf_r).statistic >= FIDELITY_MIN_SPEARMAN


def test_bf16_rounding_equals_ml_dtypes():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = np.random.default_rng(0).normal(size=10000).astype(np.float32) * 10.0 ** np.arange(-4, 6).repeat(1000)
    x = np.concatenate([x, np.float32([0.0, -0.0, 1.00390625, 1.01171875, 65504.0, 3e38])])  # ties to even
    assert np.array_equal(prec.bf16_round(x), x.astype(ml_dtypes.bfloat16).astype(np.float32))


def test_bf16_graphs_real_and_emulated(naflex_bundle, tmp_path):
    """bf16 graph: bfloat16 weights (ORT CPU cannot run it); its emulation rounds to bf16 and stays
    within the embedding gate of fp32 on random inputs."""
    import onnxruntime as ort

    t = prec.PrecisionTransform("bf16")
    assert t.graphs == ("vision", "pool", "text")  # the CP head stays fp32 under bf16 (see GRAPHS)
    t.apply("pool", naflex_bundle / "pool.onnx", tmp_path / "pool.onnx")
    assert prec.graph_precision(tmp_path / "pool.onnx") == "bf16"
    with pytest.raises(Exception, match="(?i)not_implemented|could not find an implementation"):
        ort.InferenceSession(str(tmp_path / "pool.onnx"), providers=["CPUExecutionProvider"])
    emu = prec.emulated_bf16_file(tmp_path / "pool.onnx", tmp_path / "pool.emu.onnx")
    rng = np.random.default_rng(1)
    feeds = {"hidden": rng.normal(size=(3, 40, 64)).astype(np.float32), "key_padding_mask": rng.random((3, 40)) < 0.3}
    got = ort.InferenceSession(str(emu), providers=["CPUExecutionProvider"]).run(["pooled"], feeds)[0]
    want = ort.InferenceSession(str(naflex_bundle / "pool.onnx"), providers=["CPUExecutionProvider"]).run(
        ["pooled"], feeds
    )[0]
    cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cos.min() >= FIDELITY_MIN_EMBEDDING_COSINE
    assert np.abs(got - want).max() > 1e-4  # the rounding happened (fp32 reruns agree to ~1e-7)


def test_bf16_bundle_is_refused_on_ort_cpu(naflex_bundle, tmp_path):
    dst = tmp_path / "b"
    shutil.copytree(naflex_bundle, dst)
    m = json.loads((dst / "manifest.json").read_text())
    m["precision"] = {"mode": "bf16"}
    (dst / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(BackendUnavailableError, match="bf16 graphs.*CPU provider cannot run"):
        Bundle(dst).runner("vision")


class _Copy:
    """A transform that rewrites nothing (to test the pipeline's bookkeeping)."""

    gates = "fp32"

    def __init__(self, name, variant, graphs):
        self.name, self.variant, self.graphs = name, variant, graphs

    def settings(self):
        return {"what": "copy"}

    def apply(self, graph, src, dst):
        shutil.copyfile(src, dst)
        return {"copied": graph}


def test_transform_pipeline_order_variants_and_validation(naflex_bundle, tmp_path):
    stage = tmp_path / "stage"
    shutil.copytree(naflex_bundle, stage)
    graphs = json.loads((stage / "manifest.json").read_text())["graphs"]
    seen = []

    def validate(g, path, gates):
        seen.append((g, path.name, gates))
        return {"ok": True}

    recs = run_transforms(
        stage, graphs, [_Copy("a", None, ("pool", "cp")), _Copy("b", "cpu-fused", ("pool",))], validate
    )
    assert [(r["transform"], r["graph"], r["file"]) for r in recs] == [
        ("a", "pool", "pool.onnx"),
        ("a", "cp", "cp.onnx"),
        ("b", "pool", "pool.cpu-fused.onnx"),
    ]
    assert seen == [("pool", "pool.onnx", "fp32"), ("cp", "cp.onnx", "fp32"), ("pool", "pool.cpu-fused.onnx", "fp32")]
    assert graphs["pool"]["variants"] == {"cpu-fused": {"file": "pool.cpu-fused.onnx", "transform": "b"}}
    assert recs[0]["nodes_before"] == recs[0]["nodes_after"] == len(_nodes(stage / "pool.onnx"))
    assert recs[0]["op_counts_after"]["MatMul"] >= 1 and recs[0]["facts"] == {"copied": "pool"}
    assert variant_file("vision.onnx", "cpu-fused") == "vision.cpu-fused.onnx"

    def refuse(g, path, gates):
        raise ExportValidationError(f"{g} refused")

    with pytest.raises(ExportValidationError, match="cp refused"):
        run_transforms(stage, graphs, [_Copy("c", None, ("cp",))], refuse)
    with pytest.raises(ValueError, match="no_such_graph"):
        run_transforms(stage, graphs, [_Copy("d", None, ("no_such_graph",))], validate)


@pytest.mark.slow
def test_checkpoint_failing_fp16_gates_is_refused_and_leaves_nothing(naflex_bundle, tmp_path):
    """One MLP's up-projection scaled by 1e6: fp32 is fine (LayerNorm renormalises), fp16 overflows
    (activations past 65504) -> refused with the figures and the suggestion to use fp32. Only the
    vision graph holds the edited weights: it is traced; pool, text and cp are those ``naflex_bundle``
    traced (tests/doubles ``graphs_from``), validated against the edited checkpoint all the same."""
    torch = pytest.importorskip("torch")
    from transformers import AutoModel

    from masc_engine.export.exporter import export_bundle

    ckpt = tmp_path / "overflow-naflex"
    shutil.copytree(checkpoint_dir(naflex_bundle), ckpt)
    model = AutoModel.from_pretrained(ckpt)
    with torch.no_grad():
        fc1 = model.vision_model.encoder.layers[0].mlp.fc1
        fc1.weight.mul_(1e6)
        fc1.bias.mul_(1e6)
    model.save_pretrained(ckpt)
    out = tmp_path / "bundles" / "b16"
    with pytest.raises(ExportValidationError) as e, graphs_from(naflex_bundle, only=("pool", "text", "cp")):
        export_bundle(str(ckpt), out, precision="fp16")
    msg = str(e.value)
    assert "fp16 graph 'vision' fails its gates" in msg and "--precision fp32" in msg and "cosine" in msg
    assert not out.exists() and list((tmp_path / "bundles").iterdir()) == []  # nothing half-written


def test_linked_reference_copy_keeps_external_weights_readable(tmp_path):
    """so400m graphs keep external weights (``*.data``). The exporter's fp32 reference copy hard-links
    the stage's files; a hard-linked ``.data`` made onnx refuse to load the stage's graph ("potential
    hardlink attack"), so every transform of an so400m graph failed. ``.data`` files are copied."""
    import os

    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from masc_engine.export.exporter import _linked_copy

    stage = tmp_path / "stage"
    stage.mkdir()
    w = numpy_helper.from_array(np.arange(4096, dtype=np.float32).reshape(64, 64), "w")
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])],
        [w],
    )
    onnx.save(
        helper.make_model(g),
        str(stage / "vision.onnx"),
        save_as_external_data=True,
        location="vision.onnx.data",
        size_threshold=0,
    )
    ref = _linked_copy(stage, tmp_path / "ref", ["vision.onnx", "vision.onnx.data"])
    assert os.stat(stage / "vision.onnx.data").st_nlink == 1
    for d in (stage, ref):  # both load, weights included
        m = onnx.load(str(d / "vision.onnx"))
        assert np.array_equal(numpy_helper.to_array(m.graph.initializer[0]), numpy_helper.to_array(w))
