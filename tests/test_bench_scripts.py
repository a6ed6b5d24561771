"""The benchmark scripts run on tiny shapes (the GPU one as a CPU dry run; the classic-metrics speed
bench end to end) and count FLOPs as published figures do."""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
from pathlib import Path

import pytest

from doubles.exported_graphs import graphs_from

REPO = Path(__file__).resolve().parents[1]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "bench" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_vision_flops_match_published_vit_b16():
    """DeiT (Touvron et al. 2021, Table 1) gives ViT-B/16 at 224 px as 17.6 G multiply-adds; our
    count is 2 FLOPs per multiply-add and leaves out the class token and the classifier head."""
    bench = _load("gpu_throughput")
    macs = bench.flops_per_image(width=768, layers=12, mlp=3072, patches=196) / 2
    assert math.isclose(macs, 17.6e9, rel_tol=0.015), macs


@pytest.mark.slow  # exports a bundle (a torch worker process)
def test_gpu_throughput_dry_run(naflex_bundle, tmp_path):
    """The bench's own export of random:tiny-naflex at 64 patches (references, validation, fused
    variant, manifest), its graphs those the run's command export traced from the same checkpoint
    (tests/doubles ``graphs_from``; the graphs do not depend on the patch budget)."""
    pytest.importorskip("masc")
    bench = _load("gpu_throughput")
    out = tmp_path / "dry.json"
    with graphs_from(naflex_bundle):
        argv = ["--dry-run", "--precision", "fp32", "--work", str(tmp_path / "work"), "--out", str(out)]
        assert bench.main(argv) == 0
    assert (
        json.loads((tmp_path / "work" / "tiny-naflex-64-fp32" / "manifest.json").read_text())["image"][
            "max_num_patches"
        ]
        == 64
    )
    res = json.loads(out.read_text())
    m = res["models"]["random:tiny-naflex"]
    for mode in ("fresh", "cached"):
        assert m[mode]["pairs_per_s"] > 0 and set(m[mode]["by_batch"]) == {"1", "4"}
    assert m["batch1"]["pairs"] == 3
    # the device-resident pipeline scored the same pairs as masc-metric, within the oracle tolerance
    from masc_engine.tolerances import ORACLE_SCORE_ATOL

    assert m["masc_metric"]["max_abs_dcp_vs_ours"] <= ORACLE_SCORE_ATOL
    assert m["fresh"]["mfu"] is None  # no GPU, no peak: no invented MFU
    assert m["pipeline"]["tokens_equal"] and m["pipeline"]["images"] == 8  # overlapped == serial, bit for bit


@pytest.mark.slow
def test_classic_speed_runs_on_tiny_shapes_with_scores_equal_to_the_reference(
    tmp_path, naflex_bundle, embedder_bundles
):
    """bench/classic_speed.py end to end on tiny presets: one masc-run with the five columns and the
    reference process (masc-metric plus the transformers loop) agree within the tolerances. The
    bench reuses the bundles it finds in its work folder: the run's own exports of the same presets
    (the tiny SigLIP2 at its default budget, 1,024 patches)."""
    pytest.importorskip("masc")
    pytest.importorskip("transformers")
    bench = _load("classic_speed")
    out, work = tmp_path / "classic.json", tmp_path / "work"
    for name, bundle in (
        ("tiny-naflex-1024", naflex_bundle),
        ("clip-tiny", embedder_bundles["clip-tiny"]),
        ("dino-tiny-s16", embedder_bundles["dino-tiny-s16"]),
    ):
        shutil.copytree(bundle, work / name)
    assert (
        bench.main(
            [
                "--work",
                str(work),
                "--photos",
                str(REPO / "examples" / "dreambooth"),
                "--references",
                "2",
                "--prompts",
                "1",
                "--methods",
                "2",
                "--reps",
                "1",
                "--budget",
                "1024",
                "--siglip-preset",
                "tiny-naflex",
                "--clip-preset",
                "clip-tiny",
                "--dino-preset",
                "dino-tiny-s16",
                "--profile-stages",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    res = json.loads(out.read_text())
    assert res["workload"]["pairs"] == 4 and res["workload"]["distinct_images"] == 6
    # the stage split of the masc-run process: each graph's session and run, start-up, decode
    split = res["repetitions"][0]["masc_run_stages"]
    graphs = {"vision", "text", "pool", "image"}
    assert {k.rsplit("/", 1)[1] for k in split["graph_run_s"]} >= graphs
    assert {k.rsplit("/", 1)[1] for k in split["session_or_compile_s"]} >= graphs
    assert split["raw"]["stages"]["decode:image"]["calls"] == 6  # each distinct image decoded once
    assert split["startup_s (process start -> run start: interpreter, imports, CLI, bundle manifests)"] > 0
    assert res["machine_limit"]["gemm_probe"]["fp32_numpy_gflops"] > 0
    assert set(res["scores_vs_reference"]) == {"cp", "pf", "clip_i", "clip_t", "dino"}
    for col, d in res["scores_vs_reference"].items():
        assert d["within"] and d["nan_mismatch"] == 0, (col, d)
    assert res["ratio_of_medians"] > 0 and len(res["repetitions"]) == 1
    assert "avx512_bf16" in res["machine"]["isa_flags"] and "amx_bf16" in res["machine"]["isa_flags"]
