"""What each export step hands to the exporter it calls, pinned by values (export/plan_steps.py).

The exporters are replaced by recorders, so no model is built: the scorer, segmenter and embedder
exports receive the plan's graph precision, certification, patch budget, revision and memory
limit; int8 and fp8 are refused by the ONNX step; an int8 bundle's fp32 source is exported
without the fused variant and with the quantizer's stages in its plan; an fp8 export starts from
the plan's fp32 bundle when it names one; the TensorRT step gets the plan's profile maxima,
timing cache and memory budget; a bundle at ``--out`` names the kind of an engines-only plan.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from masc_engine.export import plan_steps
from masc_engine.export.plan import ExportPlan, ExportPlanError


@pytest.fixture
def calls(monkeypatch):
    """``{exporter name: [kwargs, ...]}`` of the exporters the steps call (none runs)."""
    from masc_engine.engine.backends import tensorrt
    from masc_engine.export import embedders, exporter, fp8, segmenter

    seen: dict[str, list] = {}

    def recorder(name):
        def record(*args, **kwargs):
            seen.setdefault(name, []).append({"args": args, **kwargs})
            return Path(args[1]) if len(args) > 1 else Path(args[0])

        return record

    monkeypatch.setattr(exporter, "export_bundle", recorder("export_bundle"))
    monkeypatch.setattr(segmenter, "export_segmenter_bundle", recorder("export_segmenter_bundle"))
    monkeypatch.setattr(embedders, "export_embedder_bundle", recorder("export_embedder_bundle"))
    monkeypatch.setattr(fp8, "certify_fp8", recorder("certify_fp8"))
    monkeypatch.setattr(tensorrt, "build_engines", recorder("build_engines"))
    return seen


def test_a_scorer_export_gets_the_plans_settings(calls, tmp_path):
    plan = ExportPlan(model="m", kind="scorer", precision="fp16", max_num_patches=512, revision="r", max_memory_gb=7.5)
    plan_steps.export_onnx(plan, tmp_path, ort_cpu_variant=False)
    assert calls == {
        "export_bundle": [
            {
                "args": ("m", tmp_path),
                "max_num_patches": 512,
                "revision": "r",
                "precision": "fp16",
                "certify": None,
                "cpu_precision_options": None,
                "max_memory_gb": 7.5,
                "ort_cpu_variant": False,
            }
        ]
    }


def test_a_bf16_cpu_export_is_fp32_graphs_with_the_certification(calls, tmp_path):
    plan = ExportPlan.from_option(
        "bf16-cpu", model="m", kind="scorer", calibration_pairs="c.csv", heldout_pairs="h.csv"
    )
    plan_steps.export_onnx(plan, tmp_path)
    (call,) = calls["export_bundle"]
    assert (call["precision"], call["certify"], call["ort_cpu_variant"]) == ("fp32", "bf16-cpu", True)
    assert call["cpu_precision_options"] == {"calibration": "c.csv", "heldout": "h.csv"}


@pytest.mark.parametrize(
    "kind, exporter, graphs",
    [("scorer", "export_bundle", ("vision", "text")), ("embedder", "export_embedder_bundle", ("text", "image"))],
)
def test_the_bf16_graphs_asked_for_reach_the_certification(calls, tmp_path, kind, exporter, graphs):
    plan = ExportPlan.from_option("bf16-cpu", model="m", kind=kind, bf16_graphs=graphs)
    plan_steps.export_onnx(plan, tmp_path)
    (call,) = calls[exporter]
    assert call["cpu_precision_options"] == {"calibration": None, "heldout": None, "graphs": graphs}


def test_segmenter_and_embedder_exports_get_the_memory_limit(calls, tmp_path):
    plan_steps.export_onnx(ExportPlan(model="s", kind="segmenter", precision="fp16", max_memory_gb=3), tmp_path)
    plan_steps.export_onnx(ExportPlan(model="e", kind="embedder", revision="r", max_memory_gb=2.5), tmp_path)
    plan_steps.export_onnx(ExportPlan(model="e", kind="embedder", certify="bf16-cpu"), tmp_path)
    embedder = {"revision": None, "max_memory_gb": None, "certify": None, "cpu_precision_options": None}
    assert calls == {
        "export_segmenter_bundle": [
            {"args": ("s", tmp_path), "revision": None, "precision": "fp16", "max_memory_gb": 3}
        ],
        "export_embedder_bundle": [
            {"args": ("e", tmp_path), **embedder, "revision": "r", "max_memory_gb": 2.5},
            {
                "args": ("e", tmp_path),
                **embedder,
                "certify": "bf16-cpu",
                "cpu_precision_options": {"calibration": None, "heldout": None},
            },
        ],
    }


@pytest.mark.parametrize("precision", ["int8", "fp8"])
def test_the_onnx_step_refuses_what_is_made_from_an_fp32_bundle(calls, tmp_path, precision):
    plan = ExportPlan(model="m", kind="scorer", precision=precision, gate_pairs="p.csv")
    with pytest.raises(ExportPlanError, match=f"--precision {precision} is made from an fp32 bundle"):
        plan_steps.export_onnx(plan, tmp_path)
    assert calls == {}


@pytest.mark.parametrize("precision, then", [("int8", "int8"), ("fp8", None)])
def test_the_fp32_source_is_portable_and_plans_what_follows(calls, tmp_path, precision, then):
    plan = ExportPlan(
        model="m", kind="scorer", precision=precision, gate_pairs="p.csv", max_num_patches=256, max_memory_gb=6
    )
    plan_steps.fp32_source(plan, tmp_path)
    assert calls["export_bundle"] == [
        {
            "args": ("m", tmp_path),
            "max_num_patches": 256,
            "revision": None,
            "ort_cpu_variant": False,
            "max_memory_gb": 6,
            "then": then,
        }
    ]


def test_an_fp8_export_starts_from_the_plans_fp32_bundle(calls, tmp_path):
    plan = ExportPlan(model="m", precision="fp8", fp32_bundle="fp32-bundle", calibration_pairs="c.csv")
    assert plan_steps.export_fp8(plan, tmp_path / "out") == tmp_path / "out"
    assert "export_bundle" not in calls
    assert calls["certify_fp8"] == [
        {"args": ("fp32-bundle", tmp_path / "out"), "calibration": "c.csv", "heldout": None}
    ]


def test_the_engine_step_gets_the_plans_profile_and_budget(calls, tmp_path):
    plan = ExportPlan(
        model="m",
        backend="tensorrt",
        engines_only=True,
        max_batch=8,
        max_outs_per_ref=4,
        timing_cache="t.cache",
        gpu_memory_budget=2.0,
    )
    plan_steps.build_plan_engines(plan, tmp_path)
    assert calls["build_engines"] == [
        {
            "args": (tmp_path,),
            "precision": None,
            "max_batch": 8,
            "max_outs_per_ref": 4,
            "timing_cache": "t.cache",
            "gpu_memory_budget": 2.0,
        }
    ]


@pytest.mark.parametrize("kind, refusal", [("embedder", "an embedder bundle"), ("segmenter", "a segmenter bundle")])
def test_engines_only_takes_each_kind_of_the_bundle_at_out(tmp_path, kind, refusal):
    """TensorRT engines are the scorer's: the kind read from ``--out``'s manifest refuses the plan."""
    from masc_engine.engine.manifest import FORMAT, FORMAT_VERSION

    manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, "kind": kind}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    plan = ExportPlan(model="m", backend="tensorrt", engines_only=True)
    with pytest.raises(ExportPlanError, match=refusal):
        plan_steps.resolve_kind(plan, tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({**manifest, "kind": "scorer"}))
    assert plan_steps.resolve_kind(plan, tmp_path).kind == "scorer"
