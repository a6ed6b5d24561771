"""masc-serve's memory and cost under the hostile inputs of docs/service.md, measured on a real
server process: RSS (the kernel's ``VmRSS``/``VmHWM`` of the server) before, at the peak of and
after each attack, and the time to the answer.

Attacks: ``/v1/score_batch`` with eight 6000 x 6000 zero PNG pairs (2.9 MB of body), a 4 MB
JSON prompt, a 60 MB multipart prompt. Run it against two source trees side by side to compare
(e.g. the main branch before the memory bound and this one): ``--src`` names each tree's
``src`` folder, and the server of each runs from it.

    python bench/serve_hostile.py --bundle /tmp/bundles/tiny-naflex --src before=/work/main/src \\
        --src after=src --max-decoded-mb 512 --out bench/results/serve_hostile.json
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import platform
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples" / "dreambooth"


def machine() -> dict:
    """Where it ran: RSS is per process and not affected by other load; times are."""
    return {
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "loadavg_1_5_15": list(os.getloadavg()),
    }


def versions() -> dict:
    from importlib.metadata import version

    return {p: version(p) for p in ("masc-engine", "pillow", "numpy", "onnxruntime", "uvicorn", "fastapi")}


def _status(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def _png(arr) -> bytes:
    b = io.BytesIO()
    Image.fromarray(arr).save(b, "PNG")
    return b.getvalue()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(src: str, bundle: str, extra: list[str], log: Path):
    import httpx

    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(Path(src).resolve())}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "masc_engine.cli.serve_cmd",
            "--bundle",
            bundle,
            "--port",
            str(port),
            "--log-level",
            "warning",
            *extra,
        ],
        env=env,
        stdout=open(log, "wb"),
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        assert proc.poll() is None, log.read_text()[-2000:]
        time.sleep(0.2)
    raise RuntimeError("not ready")


def _attack(proc, send) -> dict:
    time.sleep(1)
    idle = _status(proc.pid, "VmRSS")
    Path(f"/proc/{proc.pid}/clear_refs").write_text("5")
    t0 = time.perf_counter()
    status = send()
    seconds = time.perf_counter() - t0
    peak = _status(proc.pid, "VmHWM")
    time.sleep(2)
    after = _status(proc.pid, "VmRSS")
    mb = lambda b: round(b / 2**20, 1)  # noqa: E731
    return {
        "status": status,
        "seconds": round(seconds, 3),
        "idle_rss_mb": mb(idle),
        "peak_growth_mb": mb(peak - idle),
        "rss_after_mb": mb(after),
        "after_growth_mb": mb(after - idle),
    }


def _attacks(url: str, size: int) -> dict:
    import httpx

    b64 = lambda d: base64.b64encode(d).decode()  # noqa: E731
    img, zero = _png(np.zeros((size, size, 3), np.uint8)), _png(np.zeros((size, size), np.uint8))
    sq = np.zeros((size, size), np.uint8)
    sq[size // 3 : 2 * size // 3, size // 3 : 2 * size // 3] = 255
    big = {
        "ref_image": b64(img),
        "ref_mask": b64(_png(sq)),
        "out_image": b64(img),
        "out_mask": b64(zero),
        "prompt": "a black square",
        "object_name": "square",
    }
    files = {
        k: (EXAMPLES / v).read_bytes()
        for k, v in (
            ("ref_image", "images/cat/00.jpg"),
            ("ref_mask", "masks/cat/00.png"),
            ("out_image", "images/cat/01.jpg"),
            ("out_mask", "masks/cat/01.png"),
        )
    }
    good = {k: b64(v) for k, v in files.items()} | {"prompt": "a cat", "object_name": "cat"}
    return {
        f"eight_{size}px_pairs": lambda: (
            httpx.post(url + "/v1/score_batch", json={"items": [big] * 8}, timeout=600).status_code
        ),
        "json_prompt_4mb": lambda: (
            httpx.post(url + "/v1/score", json={**good, "prompt": "a " * 2 * 2**20}, timeout=600).status_code
        ),
        "multipart_prompt_60mb": lambda: (
            httpx.post(
                url + "/v1/score",
                files={k: (k, v) for k, v in files.items()},
                data={"prompt": "a " * 30 * 2**20},
                timeout=600,
            ).status_code
        ),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--src", action="append", default=None, help="NAME=PATH of a source tree's src folder")
    ap.add_argument("--max-decoded-mb", type=float, default=None, help="passed to trees that have the option")
    ap.add_argument("--size", type=int, default=6000, help="side of the big images, pixels")
    ap.add_argument(
        "--attacks",
        default=None,
        help="comma-separated subset of the attacks (default: all; the "
        "prompt attacks took 17.7 s / 1.4 GB and an OOM kill on the tree before the budgets)",
    )
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    trees = dict(s.split("=", 1) for s in (args.src or [f"this={REPO / 'src'}"]))
    results = {}
    for name, src in trees.items():
        help_text = subprocess.run(
            [sys.executable, "-m", "masc_engine.cli.serve_cmd", "--help"],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(Path(src).resolve())},
        ).stdout
        extra = (
            ["--max-decoded-mb", str(args.max_decoded_mb)]
            if args.max_decoded_mb and "--max-decoded-mb" in help_text
            else []
        )
        log = Path(f"/tmp/serve_hostile_{name}.log")
        proc, url = _serve(src, args.bundle, extra, log)
        try:
            chosen = {
                k: f
                for k, f in _attacks(url, args.size).items()
                if args.attacks is None or k in args.attacks.split(",")
            }
            results[name] = {"options": extra, **{k: _attack(proc, f) for k, f in chosen.items()}}
        finally:
            proc.terminate()
            proc.wait(60)
        print(name, json.dumps(results[name], indent=1))
    out = {
        "script": "bench/serve_hostile.py",
        "command": shlex.join([sys.executable, *sys.argv]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine(),
        "versions": versions(),
        "bundle": args.bundle,
        "results": results,
    }
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
