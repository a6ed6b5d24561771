"""masc-serve on a port already taken ends at once, in one line, with exit status 1.

uvicorn binds after the app's start-up: the command used to log "masc-serve: ready", then
"address already in use", and exit with status 3 (a status docs/commands.md does not have), while a
readiness loop on that port probed whatever else listened there. The port is bound first now.
"""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

pytest.importorskip("fastapi", reason="masc-serve needs the serve extra")


@pytest.mark.slow
def test_a_taken_port_is_one_line_and_status_1(naflex_bundle):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "masc_engine.cli.serve_cmd", "--bundle", str(naflex_bundle), "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=120,  # a hang guard only
        )
    errors = [ln for ln in done.stderr.splitlines() if ln.startswith("Error:")]
    assert done.returncode == 1, done.stderr[-2000:]
    assert errors == [
        f"Error: --host 127.0.0.1 --port {port}: cannot listen there (Address already in use); check --host or choose another --port"
    ], done.stderr
    assert "masc-serve: ready" not in done.stderr and "Traceback" not in done.stderr
