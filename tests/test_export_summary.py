"""masc-export's summary line tells the truth: the Python warnings in the log, written by any
process (the PyTorch worker's stderr is the log), and the command's own wall time."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest

from masc_engine.cli.quiet import libraries_to_log


@pytest.mark.slow
def test_warnings_are_counted_from_the_log_whoever_wrote_them(tmp_path):
    log = tmp_path / "x.export.log"
    with libraries_to_log(log) as (say, info):
        warnings.warn_explicit("in this process", FutureWarning, "lib.py", 3)
        subprocess.run(
            [sys.executable, "-c", "import warnings; warnings.warn('in a worker', UserWarning)"],
            check=True,
            stderr=2,
            env={**os.environ, "PYTHONWARNINGS": "always"},
        )
        os.write(2, b"a C++ library's line\n")
    assert info.warnings == 2 and info.lines == 3  # two warnings (one line each) and the C++ line
    assert "(2 Python warnings)" in info.summary()


def test_the_summary_gives_the_commands_wall_time(command_export):
    """``masc-export --model random:tiny-naflex`` as a user runs it (the run's one command export)."""
    summary = [ln for ln in command_export.output.splitlines() if ln.startswith("library messages")]
    assert len(summary) == 1 and "; the command took " in summary[0], command_export.output
    n = int(summary[0].split("(")[1].split(" Python warnings")[0])
    assert n == command_export.log.read_text().count("Warning: ")  # each a one-line record here


def test_the_log_keeps_no_terminal_colour_codes(tmp_path):
    """ONNX Runtime colours its warnings even into a file; the log keeps the text."""
    log = tmp_path / "x.export.log"
    log.write_bytes(b"an earlier run\n")
    with libraries_to_log(log):
        os.write(2, b"\x1b[1;31m2026 [W:onnxruntime] a warning\x1b[m\n")
    assert log.read_bytes() == b"an earlier run\n2026 [W:onnxruntime] a warning\n"


@pytest.mark.slow
def test_the_log_gets_no_progress_bars_and_the_setting_is_given_back(tmp_path, monkeypatch):
    """Within the block huggingface_hub (and transformers through it) draw no progress bar, in this
    process or a worker it starts: "Loading weights 0%|...\\r...100%" redraws are noise in a log
    file. A value the user set is kept; none set is none after."""
    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    log = tmp_path / "x.export.log"
    probe = "from huggingface_hub.utils import are_progress_bars_disabled as d; print('bars off:', d())"
    with libraries_to_log(log):
        subprocess.run([sys.executable, "-c", probe], check=True, stdout=1)
    assert "bars off: True" in log.read_text() and "HF_HUB_DISABLE_PROGRESS_BARS" not in os.environ
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "0")
    with libraries_to_log(log):
        assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "0"
