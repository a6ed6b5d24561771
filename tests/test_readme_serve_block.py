"""The README's masc-serve block, run as pasted: it waits for readiness, scores, and exits 0.

The block is taken from README.md itself (the bash block that starts ``masc-serve``), run by bash in
a folder laid out as the demo leaves a checkout (``bundles/tiny-naflex``, ``examples/``), with two
edits a test needs: the ``pip install`` line is dropped (the test environment has the extra) and
port 8000 becomes a free port. A block that sends ``curl`` before the server listens, hides a
refused connection, or ends in anything but ``exit status 0`` fails here.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def _serve_block() -> str:
    blocks = re.findall(r"^```bash\n(.*?)^```", (REPO / "README.md").read_text(encoding="utf-8"), re.S | re.M)
    [block] = [b for b in blocks if "masc-serve --bundle" in b]
    return block


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _needs_serve_and_curl() -> None:
    pytest.importorskip("fastapi", reason="masc-serve needs the serve extra")
    if subprocess.run(["bash", "-c", "command -v curl"], capture_output=True).returncode:
        pytest.skip("curl is not installed")


def _demo_layout(folder: Path, naflex_bundle: Path) -> None:
    """``folder`` laid out as the demo leaves a checkout: bundles/tiny-naflex and examples/."""
    (folder / "bundles").mkdir()
    (folder / "bundles" / "tiny-naflex").symlink_to(naflex_bundle)
    (folder / "examples").symlink_to(REPO / "examples")


def _run_block(script: str, cwd: Path) -> subprocess.CompletedProcess:
    # A hang guard only: each block ends by itself once the server is ready and has answered.
    return subprocess.run(
        ["bash", "-c", script],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def test_readme_serve_block_runs_as_pasted(naflex_bundle, tmp_path):
    _needs_serve_and_curl()
    _demo_layout(tmp_path, naflex_bundle)
    lines = [ln for ln in _serve_block().splitlines() if not ln.startswith("pip install")]
    script = "\n".join(lines).replace("8000", str(_free_port()))
    done = _run_block(script, tmp_path)
    out = done.stdout.splitlines()
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(out[0])["status"] == "ready"
    score = json.loads(out[1])
    assert score["status"] == "ok" and set(score) >= {"cp", "pf", "cp_status", "pf_status"}
    assert out[-1] == "exit status 0"


def _blocks(page: Path, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", page.read_text(encoding="utf-8"), re.S | re.M)


def test_service_page_blocks_run_as_pasted(naflex_bundle, tmp_path):
    """docs/service.md's "Calling it": its bash block (server in the background, wait, upload; its
    ``pip install`` line dropped as in the README's test) then its Python client (standard library
    only) against that server, then the ``kill $SERVER; wait $SERVER`` the page names; every output
    as the page says."""
    _needs_serve_and_curl()
    page = REPO / "docs" / "service.md"
    [shell] = [b for b in _blocks(page, "bash") if "masc-serve --bundle" in b]
    python = _blocks(page, "python")[0]
    _demo_layout(tmp_path, naflex_bundle)
    port = str(_free_port())
    (tmp_path / "client.py").write_text(python.replace("8000", port))
    shell = "\n".join(ln for ln in shell.splitlines() if not ln.startswith("pip install"))
    script = (shell + f'\n"{sys.executable}" client.py\nkill $SERVER; wait $SERVER; echo "exit status $?"\n').replace(
        "8000", port
    )
    done = _run_block(script, tmp_path)
    out = done.stdout.splitlines()
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(out[0])["status"] == "ready"
    upload = json.loads(out[1])
    assert upload["status"] == "ok"
    assert len(out) == 5, done.stdout + done.stderr[-2000:]
    cp, pf, status = out[2].split()
    assert (float(cp), float(pf), status) == (upload["cp"], upload["pf"], "ok")
    assert out[3] == "2" and out[-1] == "exit status 0"
