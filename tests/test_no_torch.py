"""The runtime imports and masc-run runs with torch (and transformers) made unimportable."""

from __future__ import annotations

import csv
import subprocess
import sys

import pytest

from support import EXAMPLES, REPO

BLOCK = "import sys; sys.modules['torch'] = None; sys.modules['transformers'] = None; "


@pytest.mark.slow
def test_runtime_imports_without_torch():
    code = BLOCK + (
        "import masc_engine, masc_engine.runtime.scorer, masc_engine.jobs.pairs, "
        "masc_engine.cli.run_cmd; "
        "assert 'torch' not in [m for m in sys.modules if sys.modules[m] is not None]; print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


@pytest.mark.slow
def test_masc_run_scores_examples_without_torch(naflex_bundle, tmp_path):
    out_csv = tmp_path / "scores.csv"
    code = BLOCK + "from masc_engine.cli.run_cmd import main; main()"
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            str(EXAMPLES / "pairs.csv"),
            "--bundle",
            str(naflex_bundle),
            "--out",
            str(out_csv),
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    rows = list(csv.DictReader(open(out_csv)))
    assert len(rows) == 20 and all(r["status"] == "ok" for r in rows)
    assert all(-1.0 <= float(r["cp"]) <= 1.0 and -1.0 <= float(r["pf"]) <= 1.0 for r in rows)
    assert "same_subject_photo" in proc.stdout
