"""masc-export's stages, memory plan and staging: what a user on a workstation relies on.

The PyTorch stages run in a worker process that ends before ONNX Runtime loads the weights; each
stage prints its time and memory; a plan that does not fit the memory limit is refused in one line
before the weights are read; a killed export's staging folder is cleaned up by the next one; every
bundle file has one mode (export/stages.py, export/torch_worker.py, export/exporter.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from support import REPO
from masc_engine.export import stages
from masc_engine.export.exporter import remove_stale_stages, uniform_file_modes
from masc_engine.tolerances import FLOAT32_SAME_ARITHMETIC_ATOL

TORCH_STAGES = [
    "checkpoint",
    "vision references",
    "export vision",
    "export pool",
    "text references",
    "export text",
    "export cp",
]


def test_stages_are_recorded_in_order_with_time_and_memory(naflex_bundle):
    recs = json.loads((naflex_bundle / "manifest.json").read_text())["export_stages"]
    names = [r["stage"] for r in recs]
    assert names == TORCH_STAGES + [
        "validate vision",
        "validate pool",
        "validate text",
        "validate cp",
        "ort-fusion vision",
        "ort-fusion text",
        "ort-cpu scores",
        "onnx checker",
    ]
    # PyTorch only in the worker; ONNX Runtime only after it ended, one graph per stage
    assert [r["process"] for r in recs] == ["torch worker"] * len(TORCH_STAGES) + ["exporter"] * 8
    for r in recs:
        assert r["seconds"] >= 0 and 0.05 < r["rss_gb_after"] <= r["peak_rss_gb"] + 0.01 < 4


def test_stage_line_format_is_what_the_bench_parses(caplog):
    sys.path.insert(0, str(REPO / "bench"))
    from export_memory import STAGE_LINE

    caplog.set_level("INFO", logger="masc_engine")
    clock = stages.StageClock()
    with clock.stage("validate vision") as note:
        note["message"] = "validated vision: max |error| 1e-06"
    clock.record("export text", 12.34, int(3.2e9), int(2.9e9), "exported text -> text.onnx", " (torch worker)")
    lines = [r.getMessage() for r in caplog.records if r.name == "masc_engine.export.stages"]
    assert lines[0].startswith("validated vision: max |error| 1e-06 [validate vision: ")
    assert lines[1] == "exported text -> text.onnx [export text: 12.3 s, peak 3.20 GB, now 2.90 GB (torch worker)]"
    m = STAGE_LINE.search(lines[1])
    assert (m["stage"], m["seconds"], m["peak"], m["now"], m["where"]) == (
        "export text",
        "12.3",
        "3.20",
        "2.90",
        "torch worker",
    )
    assert STAGE_LINE.search(lines[0])["stage"] == "validate vision"
    assert [r["stage"] for r in clock.records] == ["validate vision", "export text"]


def test_memory_plan_scales_with_the_weights_and_refuses_in_one_line():
    so400m = {"vision": 1_713_000_000, "pool": 60_000_000, "text": 1_641_000_000}  # random:so400m-naflex
    plan = stages.plan_memory(so400m, "fp32")
    assert set(plan.stages) == {"torch", "validate", "fuse"}
    half = stages.plan_memory({g: b // 2 for g, b in so400m.items()}, "fp32")
    assert half.peak[1] < plan.peak[1]
    assert stages.plan_memory(so400m, "fp16", fused=False).stages.keys() == {"torch", "validate", "precision", "pairs"}
    # above what bench/export_memory.py measured at this shape (bench/results/export_memory_so400m.json)
    measured = {"torch": 4.00e9, "validate": 2.54e9, "fuse": 3.29e9, "precision": 8.58e9, "pairs": 5.13e9}
    fp16 = stages.plan_memory(so400m, "fp16", fused=False).stages
    assert all({**plan.stages, **fp16}[k] >= v for k, v in measured.items())
    line = stages.check_memory_plan(plan, 100, "random:so400m-naflex")
    assert line.startswith("memory plan: peak about") and "--max-memory-gb 100" in line
    with pytest.raises(stages.ExportMemoryError) as e:
        stages.check_memory_plan(plan, 2, "random:so400m-naflex")
    msg = str(e.value)
    assert "\n" not in msg and "more than --max-memory-gb 2 (2.0 GB)" in msg and "raise --max-memory-gb" in msg
    assert f"about {plan.peak[1] / 1e9:.1f} GB" in msg and f"{plan.peak[0]} stage" in msg


@pytest.mark.slow
def test_cli_refuses_a_plan_past_max_memory_gb_before_reading_weights(tmp_path):
    """The refusal comes before any stage reads weights (for a random: preset, from its shapes,
    before its checkpoint is even built); one line, no traceback, nothing left beside --out."""
    out = tmp_path / "bundles" / "b"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "masc_engine.cli.export_cmd",
            "--model",
            "random:tiny-naflex",
            "--out",
            str(out),
            "--max-memory-gb",
            "0.5",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 1, res.stderr
    err = [ln for ln in res.stderr.splitlines() if ln.startswith("Error:")]
    assert len(err) == 1 and "more than --max-memory-gb 0.5" in err[0] and "Traceback" not in res.stderr
    assert "[checkpoint:" not in res.stderr and "export vision" not in res.stderr
    assert sorted(p.name for p in (tmp_path / "bundles").iterdir()) == ["b.export.log"]


@pytest.mark.slow
def test_worker_errors_reach_the_user_as_one_line(tmp_path):
    """A checkpoint error raised in the PyTorch worker is the same one-line error as before."""
    out = tmp_path / "b"
    res = subprocess.run(
        [sys.executable, "-m", "masc_engine.cli.export_cmd", "--model", "random:no-such-preset", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert "Error: unknown random model 'random:no-such-preset'" in res.stderr
    assert not out.exists() and not list(tmp_path.glob(".b.*"))


def test_remove_stale_stages(tmp_path, caplog):
    dead = 4_194_304 + 12_345  # above Linux's largest pid_max: no such process
    assert not stages.process_alive(dead) and stages.process_alive(os.getppid())
    out = tmp_path / "bundle"
    old = time.time() - 3600

    def make(name, mtime=old):
        p = tmp_path / name
        p.mkdir()
        (p / "vision.onnx.data").write_bytes(b"\0" * 10)
        os.utime(p, (mtime, mtime))
        return p

    stale = make(f".bundle.{dead}.partial")
    alive = make(f".bundle.{os.getppid()}.partial")  # another export still running
    young = make(f".bundle.{dead + 1}.partial", mtime=time.time() + 3600)  # not older than this export
    other = make(f".bundle2.{dead}.partial")  # another target
    swap = make(f".bundle.{dead}.old")  # the replaced bundle of an interrupted swap: only copy while bundle is absent
    caplog.set_level("INFO", logger="masc_engine")
    assert remove_stale_stages(out) == [stale.name]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and stale.name in lines[0] and "removed 1 stale staging folder" in lines[0]
    assert all(p.exists() for p in (alive, young, other, swap)) and not stale.exists()
    out.mkdir()
    (out / "manifest.json").write_text("{}")  # the swap completed: the .old bundle is garbage
    assert remove_stale_stages(out) == [swap.name]
    assert remove_stale_stages(out) == [] and len(caplog.records) == 2


def test_every_bundle_file_has_the_same_mode(naflex_bundle, tmp_path):
    mask = os.umask(0)
    os.umask(mask)
    want = 0o666 & ~mask
    assert {p.name: p.stat().st_mode & 0o777 for p in naflex_bundle.iterdir()} == {
        p.name: want for p in naflex_bundle.iterdir()
    }
    f = tmp_path / "w.onnx.data"
    f.write_bytes(b"x")
    f.chmod(0o600)  # as the onnx library writes external data
    assert uniform_file_modes(tmp_path) == want and f.stat().st_mode & 0o777 == want


def test_the_exporter_process_never_imports_torch(command_export):
    """PyTorch lives in the worker only: the command's own process never imports it, so no PyTorch
    weights are resident while ONNX Runtime sessions and transforms run (the run's one
    ``masc-export --model random:tiny-naflex``, tests/support ``CommandExport``)."""
    assert f"{command_export.IMPORTS} False False" in command_export.output, command_export.output[-2000:]
    assert command_export.returncode == 0 and (command_export.bundle / "manifest.json").is_file()
    assert not list(command_export.bundle.parent.glob(".naflex.*"))  # no staging folder left


RESULTS = REPO / "bench" / "results" / "export_memory_so400m.json"
STAGE_KIND = {
    "checkpoint": "torch",
    "vision references": "torch",
    "text references": "torch",
    "export": "torch",
    "validate": "validate",
    "ort-fusion": "fuse",
    "ort-cpu scores": "fuse",
    "precision-fp16": "precision",
    "fp32 pair scores": "pairs",
    "fp16 pair gates": "pairs",
    "onnx checker": "validate",
}


def _kind(stage: str) -> str:
    return next(k for prefix, k in STAGE_KIND.items() if stage.startswith(prefix))


@pytest.mark.parametrize(
    "preset, budget, results",
    [
        ("so400m-naflex", 1024, "export_memory_so400m1024_bf16cpu.json"),
        ("base-naflex", 256, "export_memory_base256_bf16cpu.json"),
    ],
)
def test_the_bf16_cpu_plan_covers_its_certification(preset, budget, results):
    """The bf16-cpu export peaks in its certification, after the stages: 11.29 GB at so400m/1024
    (where the stages' plan said 5.0 GB) and 2.41 GB at base/256 (bench/results/export_memory_*).
    The plan has that stage, above each measurement, and at so400m a limit between the stages'
    plan and it refuses it at once."""
    from masc_engine.export.config_budget import check_config_budget
    from masc_engine.export.random_models import preset_config

    run = json.loads((REPO / "bench/results" / results).read_text())["runs"][0]
    assert run["precision"] == "bf16-cpu" and run["exit_code"] == 0
    config = preset_config(preset)
    line = check_config_budget(f"random:{preset}", config, 100, "bf16-cpu")
    planned = float(line.split("peak about ")[1].split(" GB")[0])
    assert planned >= run["tree_peak_rss_gb"] and "certify stage" in line
    assert "certify stage" in run["memory_plan_line"] or preset == "so400m-naflex"  # one plan, certify included
    if preset == "so400m-naflex":
        assert "torch stage" in check_config_budget(f"random:{preset}", config, 8, "fp32")
        with pytest.raises(stages.ExportMemoryError, match="certify stage"):
            check_config_budget(f"random:{preset}", config, 8, "bf16-cpu")


def test_the_int8_plan_covers_its_quantizer_and_gates():
    """masc-export --precision int8 at so400m/1024 (bench/results/export_memory_so400m1024_int8.json):
    the tree peaked at 5.34 GB in ONNX Runtime's quantizer, after the fp32 stages, where the plan
    then said 5.0 GB (it did not know the quantizer and the pair gates came next). The int8 plan has
    both stages, each above its measurement, and a limit between the fp32 plan and it refuses
    the int8 export from the config."""
    from masc_engine.export.config_budget import check_config_budget, estimate_parameters
    from masc_engine.export.random_models import preset_config

    run = json.loads((REPO / "bench/results/export_memory_so400m1024_int8.json").read_text())["runs"][0]
    assert run["precision"] == "int8" and not run["killed_by_watchdog"]
    measured: dict = {}
    for s in run["stages"]:
        kind = (
            "quantize" if s["stage"].startswith("quantize") else "pairs" if s["stage"].startswith("int8 gate") else None
        )
        if kind:
            measured[kind] = max(measured.get(kind, 0.0), s["stage_peak_rss_gb"])
    # the export's peak came in the quantizer, after the stages the old plan knew
    assert set(measured) == {"quantize", "pairs"} and max(measured, key=measured.get) == "quantize"
    assert max(measured.values()) <= run["tree_peak_rss_gb"]
    config = preset_config("so400m-naflex")
    params, _ = estimate_parameters(config)
    plan = stages.plan_memory({g: 4 * n for g, n in params.items()}, "fp32", fused=False, then="int8")
    for kind, gb in measured.items():
        assert plan.stages[kind] / 1e9 >= gb, (kind, plan.stages[kind] / 1e9, gb)
    fp32_line = check_config_budget("random:so400m-naflex", config, 100, "fp32", fused=False)
    fp32_peak = float(fp32_line.split("peak about ")[1].split(" GB")[0])
    assert fp32_peak < run["tree_peak_rss_gb"]  # what the plan said before
    with pytest.raises(stages.ExportMemoryError, match="pairs stage"):
        check_config_budget("random:so400m-naflex", config, run["tree_peak_rss_gb"], "int8", fused=False)


@pytest.mark.parametrize(
    "options", [dict(then="bogus"), dict(then="int8", certify="bf16-cpu"), dict(then="int8", precision="fp16")]
)
def test_then_is_int8_after_fp32_graphs_only(options, tmp_path):
    from masc_engine.export.exporter import export_bundle

    with pytest.raises(ValueError, match="then must be None or 'int8'"):
        export_bundle("random:tiny-naflex", tmp_path / "b", **options)
    assert not list(tmp_path.iterdir())


def test_the_fp32_export_an_int8_bundle_starts_from_plans_the_quantizer(tmp_path, monkeypatch):
    """masc-export --precision int8 exports its fp32 source with ``then="int8"``
    (export/plan_steps.py ``fp32_source``): the quantize stage, made the peak here, is refused from
    the config before any model is built."""
    from masc_engine.export.plan import ExportPlan
    from masc_engine.export.plan_steps import fp32_source

    monkeypatch.setitem(stages.MEMORY_MODEL, "quantize", (5.0, 0.0, 0.0))
    plan = ExportPlan(model="random:tiny-naflex", precision="int8", gate_pairs="p.csv", max_memory_gb=3)
    with pytest.raises(stages.ExportMemoryError, match="quantize stage.*config.json"):
        fp32_source(plan, tmp_path / "fp32")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("from_config", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_a_bf16_cpu_export_plans_its_certification_once_from_config_and_weights(from_config, tmp_path, monkeypatch):
    """``export_bundle(certify="bf16-cpu")`` has one memory plan, and it includes the certification:
    from the config before the model is built, then from the weights once the checkpoint is open
    (export/exporter.py). The certify stage is made the peak here (a tiny model's own certification
    is below the torch stage), so a limit between the torch stage and it refuses from each plan in turn."""
    from masc_engine.engine.backends import openvino
    from masc_engine.export import config_budget
    from masc_engine.export.exporter import export_bundle

    monkeypatch.setattr(openvino, "check_available", lambda **_: None)  # no certification runs here
    monkeypatch.setitem(stages.MEMORY_MODEL, "certify", (5.0, 0.0, 0.0))
    if not from_config:  # the config's plan passes: the weights' plan must refuse
        monkeypatch.setattr(config_budget, "preflight", lambda *a, **k: None)
    with pytest.raises(stages.ExportMemoryError, match="certify stage") as e:
        export_bundle("random:tiny-naflex", tmp_path / "b", certify="bf16-cpu", max_memory_gb=3)
    assert ("config.json" in str(e.value)) is from_config
    assert not (tmp_path / "b").exists() and not list(tmp_path.glob(".b.*"))


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_so400m_measurement_meets_the_budgets_and_the_plan_covers_it(precision):
    """bench/results/export_memory_so400m.json (random:so400m-naflex): peak RSS <= 10 GB for fp32
    and fp16 (the largest process, as /usr/bin/time -v reports it, and the whole process tree),
    the fp32 bundle <= 4 GB on disk for every target, its scores equal to a one-copy-per-graph
    bundle's, and the memory plan's estimate above every stage's measured peak."""
    res = json.loads(RESULTS.read_text())
    run = next(r for r in res["runs"] if r["precision"] == precision and r["exit_code"] == 0)
    assert run["model"] == "random:so400m-naflex" and not run["killed_by_watchdog"]
    assert run["time_v_max_rss_gb"] <= 10 and run["tree_peak_rss_gb"] <= 10
    sizes = {"vision": 0, "pool": 0, "text": 0}
    for line in [run["memory_plan_line"]]:  # "... (fp32 weights: vision 1.65 GB, pool 0.06 GB, text 1.65 GB) ..."
        for g in sizes:
            sizes[g] = int(float(line.split(f"{g} ")[1].split(" GB")[0]) * 1e9 * 1.01)
    plan = stages.plan_memory(sizes, precision, fused=precision == "fp32").stages
    for s in run["stages"]:
        assert plan[_kind(s["stage"])] >= s["stage_peak_rss_gb"] * 1e9, s
    if precision == "fp32":
        assert max(run["bundle"]["gb_by_target"].values()) <= 4
        cmp = run["scores_vs_one_copy_per_graph"]
        assert cmp["pairs"] >= 20 and max(cmp["max_abs_dcp"], cmp["max_abs_dpf"]) <= FLOAT32_SAME_ARITHMETIC_ATOL
        assert cmp["gb_by_target"]["one_copy_per_graph"]["all"] > 1.9 * cmp["gb_by_target"]["shared"]["all"]


def test_bundle_size_per_target(naflex_bundle):
    sys.path.insert(0, str(REPO / "bench"))
    from export_memory import bundle_sizes

    m = json.loads((naflex_bundle / "manifest.json").read_text())
    size = lambda *names: sum((naflex_bundle / n).stat().st_size for n in names + ("manifest.json",))  # noqa: E731
    got = bundle_sizes(naflex_bundle)["bytes_by_target"]
    assert got["all"] == size(*m["files"])
    assert got["cpu"] == size(
        "tokenizer.json",
        "vision.ort-cpu.onnx",
        "vision.onnx.data",
        "text.ort-cpu.onnx",
        "text.onnx.data",
        "pool.onnx",
        "cp.onnx",
    )
    assert got["gpu"] == size(
        "tokenizer.json", "vision.onnx", "vision.onnx.data", "text.onnx", "text.onnx.data", "pool.onnx", "cp.onnx"
    )
