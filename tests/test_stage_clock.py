"""The opt-in stage split (engine/stage_clock.py, ``MASC_PROFILE_STAGES``): off by default, and on,
it names each stage a pairs run goes through, per graph."""

from __future__ import annotations

import json

import pytest

from support import EXAMPLES
from masc_engine.engine import stage_clock


@pytest.fixture(autouse=True)
def _fresh():
    stage_clock.reset()
    yield
    stage_clock.reset()


def test_off_by_default_records_nothing(monkeypatch):
    monkeypatch.delenv(stage_clock.ENV_VAR, raising=False)
    with stage_clock.stage("x"):
        pass
    stage_clock.timed("y")(lambda: 1)()
    stage_clock.mark("m")
    snap = stage_clock.snapshot()
    assert snap["stages"] == {} and snap["marks"] == {}
    assert stage_clock.write() is None


def test_on_it_counts_calls_and_writes_json(monkeypatch, tmp_path):
    out = tmp_path / "stages.json"
    monkeypatch.setenv(stage_clock.ENV_VAR, str(out))
    for _ in range(3):
        with stage_clock.stage("x"):
            pass
    assert stage_clock.timed("y")(lambda a: a + 1)(1) == 2
    stage_clock.mark("m")
    assert stage_clock.write() == out
    got = json.loads(out.read_text())
    assert got["stages"]["x"]["calls"] == 3 and got["stages"]["y"]["calls"] == 1
    assert set(got["marks"]) == {"m"}
    assert got["process_start"] is not None and got["process_start"] <= got["clock_imported"] <= got["ended"]


@pytest.mark.slow  # spawns Python processes
def test_process_start_falls_between_the_spawn_and_the_child_reading_it():
    # The start-up stage is measured from here: btime (whole seconds) put it up to 1 s before the
    # process existed. An ordering check, not a timing bound: spawn <= start <= read.
    import subprocess
    import sys
    import time

    code = "import time; from masc_engine.engine import stage_clock as c; print(c.process_start(), time.time())"
    for _ in range(3):
        spawned = time.time()
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
        start, read = map(float, out.split())
        # 10 ms: /proc's clock-tick resolution; the spawn is taken before the fork.
        assert spawned - 0.011 <= start <= read


def test_a_pairs_run_names_each_stage_per_graph(naflex_bundle, tmp_path, monkeypatch):
    from masc_engine.jobs.pairs import RunOptions, run_pairs
    from masc_engine.runtime.scorer import Scorer

    monkeypatch.setenv(stage_clock.ENV_VAR, str(tmp_path / "stages.json"))
    monkeypatch.setenv("MASC_ENGINE_CACHE", str(tmp_path / "root"))
    run_pairs(EXAMPLES / "pairs.csv", Scorer(naflex_bundle), tmp_path / "s.csv", options=RunOptions(progress=False))
    snap = stage_clock.snapshot()
    name = naflex_bundle.name
    for graph in ("vision", "text", "pool"):
        assert snap["stages"][f"session:{name}/{graph}"]["calls"] == 1
        assert snap["stages"][f"run:{name}/{graph}"]["calls"] >= 1
    for s in ("bundle_hash", "decode:image", "decode:mask", "preprocess:siglip2", "write"):
        assert snap["stages"][s]["calls"] >= 1, s
    assert set(snap["marks"]) == {"run_pairs", "scored", "written"}
