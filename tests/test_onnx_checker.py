"""Every graph of every bundle kind passes ``onnx.checker.check_model(full_check=True)``, and the
exporter refuses a bundle whose graphs do not (export/onnx_check.py).

The fp16 / bf16 converter appends its Casts at the end of the node list; export/precision.py
``topological_sort`` puts them back in order (before it, the checker refused every reduced-
precision graph with "Nodes in a graph must be topologically sorted").
"""

from __future__ import annotations

import shutil

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from doubles.exported_graphs import graphs_from
from masc_engine.errors import ExportValidationError
from masc_engine.export.onnx_check import check_graphs
from masc_engine.export.precision import topological_sort


def _graph_files(bundle):
    import json

    return json.loads((bundle / "manifest.json").read_text())["files"]


def _check_all(bundle):
    files = [f for f in _graph_files(bundle) if f.endswith(".onnx")]
    assert files
    for name in files:
        onnx.checker.check_model(str(bundle / name), full_check=True)
    return files


def test_fp32_bundle_with_fused_variant_passes(naflex_bundle):
    files = _check_all(naflex_bundle)
    assert {"vision.ort-cpu.onnx", "text.ort-cpu.onnx"} <= set(files)  # com.microsoft ops, well formed


def test_fp16_bundle_passes(fp16_bundle):
    assert {"vision.onnx", "pool.onnx", "text.onnx", "cp.onnx"} <= set(_check_all(fp16_bundle))


@pytest.mark.slow
def test_bf16_bundle_passes(naflex_bundle, tmp_path):
    """``export_bundle(random:tiny-naflex, precision="bf16")``: the bf16 transform, its gates and
    the checker on the graphs the run's command export traced from the same checkpoint
    (tests/doubles ``graphs_from``; the transform starts from the fp32 graphs either way)."""
    pytest.importorskip("torch", reason="exporting a test bundle needs the export extra (torch)")
    from masc_engine.export.exporter import export_bundle

    with graphs_from(naflex_bundle):
        bundle = export_bundle("random:tiny-naflex", tmp_path / "bf16", precision="bf16")
    assert len(_check_all(bundle)) == 4


def test_int8_bundle_passes(naflex_bundle, tmp_path):
    from masc_engine.export.int8 import quantize_graphs

    stage = tmp_path / "int8"
    shutil.copytree(naflex_bundle, stage)
    manifest = quantize_graphs(naflex_bundle, stage)
    assert manifest["onnx_checker"]["graphs"] == sorted(f for f in manifest["files"] if f.endswith(".onnx"))
    _check_all(stage)


def _chain(order):
    """x -> A -> B -> C -> y with the nodes listed in ``order``."""
    nodes = {
        "A": helper.make_node("Relu", ["x"], ["a"], name="A"),
        "B": helper.make_node("Neg", ["a"], ["b"], name="B"),
        "C": helper.make_node("Abs", ["b"], ["y"], name="C"),
    }
    vi = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, [2])  # noqa: E731
    return helper.make_model(
        helper.make_graph([nodes[k] for k in order], "g", [vi("x")], [vi("y")]),
        opset_imports=[helper.make_opsetid("", 18)],
    )


def test_topological_sort_orders_and_keeps_order_stable():
    m = _chain("CAB")
    with pytest.raises(onnx.checker.ValidationError, match="topologically sorted"):
        onnx.checker.check_model(m, full_check=True)
    assert topological_sort(m.graph) == 3
    assert [n.name for n in m.graph.node] == ["A", "B", "C"]
    onnx.checker.check_model(m, full_check=True)
    assert topological_sort(m.graph) == 0  # already sorted: nothing moves


def test_topological_sort_refuses_dangling_inputs_and_cycles():
    m = _chain("ABC")
    m.graph.node[0].input[0] = "nowhere"
    with pytest.raises(ValueError, match="'nowhere'"):
        topological_sort(m.graph)
    m = _chain("ABC")
    m.graph.node[0].input[0] = "y"  # A reads C's output: a cycle
    with pytest.raises(ValueError, match="cycle"):
        topological_sort(m.graph)


def test_topological_sort_counts_subgraph_reads_of_outer_values():
    """An ``If`` whose branch reads an outer value must come after that value's producer."""
    vi = lambda n, t=TensorProto.FLOAT: helper.make_tensor_value_info(n, t, [2])  # noqa: E731
    branch = lambda op: helper.make_graph([helper.make_node(op, ["a"], ["o"])], op, [], [vi("o")])  # noqa: E731
    cond = helper.make_node("Constant", [], ["c"], value=helper.make_tensor("c", TensorProto.BOOL, [], [True]))
    iff = helper.make_node("If", ["c"], ["y"], then_branch=branch("Relu"), else_branch=branch("Neg"), name="if")
    relu = helper.make_node("Relu", ["x"], ["a"], name="producer")
    m = helper.make_model(
        helper.make_graph([iff, cond, relu], "g", [vi("x")], [vi("y")]), opset_imports=[helper.make_opsetid("", 18)]
    )
    topological_sort(m.graph)
    names = [n.name or n.op_type for n in m.graph.node]
    assert names.index("producer") < names.index("if") and names.index("Constant") < names.index("if")
    onnx.checker.check_model(m, full_check=True)


def test_export_check_refuses_a_graph_out_of_order(naflex_bundle, tmp_path):
    stage = tmp_path / "b"
    shutil.copytree(naflex_bundle, stage)
    m = onnx.load(str(stage / "pool.onnx"))
    nodes = list(m.graph.node)
    del m.graph.node[:]
    m.graph.node.extend(nodes[::-1])
    onnx.save(m, str(stage / "pool.onnx"))
    with pytest.raises(ExportValidationError, match=r"1 graph\(s\) fail.*pool.onnx.*topologically sorted") as e:
        check_graphs(stage, _graph_files(stage))
    assert set(e.value.report) == {"pool.onnx"}
    assert np.isfinite(len(check_graphs(naflex_bundle, _graph_files(naflex_bundle))))
