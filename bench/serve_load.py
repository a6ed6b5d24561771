"""Load test of masc-serve on loopback with locust: throughput, p50/p99 latency, error
rate and peak RSS at 1, 4, 16 and 64 concurrent clients, with micro-batching (``--max-batch``
8) and without (``--max-batch 1``), on a base-shaped random-weight bundle.

Traffic is evaluation-shaped: real DreamBooth pairs (../shared/data/dreambooth, 158 pairs over
30 references), so references repeat and the reference cache is part of what is measured, as in a
real evaluation. Each configuration gets a fresh server process; peak RSS is the server's
``VmHWM`` after each level (cumulative over the levels, as a server's memory grows).

Needs the ``[serve]`` and ``[bench]`` extras (``pip install -e '.[serve,bench]'``). Run it on an
otherwise idle machine (locust's own process competes with the server for the same cores, which
the results file says):

    python bench/serve_load.py

Results: bench/results/serve_load.json and serve_load.md.
"""

from __future__ import annotations

import argparse
import base64
import csv
import datetime
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data" / "dreambooth"
LEVELS = (1, 4, 16, 64)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_bodies(path: Path, n: int | None) -> tuple[int, int]:
    """JSON bodies of the first ``n`` shared pairs: (pairs, distinct references)."""
    rows = list(csv.DictReader(open(SHARED / "pairs.csv", newline="", encoding="utf-8-sig")))[:n]
    with open(path, "w") as f:
        for r in rows:
            body = {
                k: base64.b64encode((SHARED / r[k]).read_bytes()).decode()
                for k in ("ref_image", "ref_mask", "out_image", "out_mask")
            }
            body.update(prompt=r["prompt"], object_name=r["object_name"])
            f.write(json.dumps(body) + "\n")
    return len(rows), len({r["ref_image"] for r in rows})


def rss_mb(pid: int) -> tuple[float, float]:
    """(current, peak) resident set of a process, MiB, from /proc."""
    vals = {}
    for line in open(f"/proc/{pid}/status"):
        k, _, v = line.partition(":")
        if k in ("VmRSS", "VmHWM"):
            vals[k] = int(v.split()[0]) / 1024
    return vals["VmRSS"], vals["VmHWM"]


def start_server(
    bundle: Path, max_batch: int, max_wait_ms: float, budget: int, log: Path
) -> tuple[subprocess.Popen, str]:
    import httpx

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "masc_engine.cli.serve_cmd",
            "--bundle",
            str(bundle),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--max-batch",
            str(max_batch),
            "--max-wait-ms",
            str(max_wait_ms),
            "--max-num-patches",
            str(budget),
            "--log-level",
            "warning",
            "--request-timeout-s",
            "600",
            "--max-queue",
            "4096",
        ],
        stdout=open(log, "wb"),
        stderr=subprocess.STDOUT,
    )
    deadline = time.time() + 300
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"masc-serve exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError("masc-serve not ready in 300 s")


def run_locust(url: str, users: int, seconds: int, bodies: Path, prefix: Path) -> dict:
    env = {**os.environ, "MASC_BENCH_BODIES": str(bodies)}
    cmd = [
        str(Path(sys.executable).with_name("locust")),
        "-f",
        str(REPO / "bench" / "serve_locustfile.py"),
        "--headless",
        "-u",
        str(users),
        "-r",
        str(users),
        "-t",
        f"{seconds}s",
        "--host",
        url,
        "--csv",
        str(prefix),
        "--only-summary",
        "--stop-timeout",
        "300",
        "--loglevel",
        "WARNING",
    ]
    subprocess.run(cmd, env=env, check=False, capture_output=True, timeout=seconds + 400)
    stats = list(csv.DictReader(open(f"{prefix}_stats.csv")))
    agg = next(r for r in stats if r["Name"] == "Aggregated")
    n, fails = int(agg["Request Count"]), int(agg["Failure Count"])
    return {
        "clients": users,
        "seconds": seconds,
        "requests": n,
        "failures": fails,
        "error_rate": fails / n if n else None,
        "requests_per_s": float(agg["Requests/s"]),
        "p50_ms": float(agg["50%"]),
        "p99_ms": float(agg["99%"]),
        "mean_ms": float(agg["Average Response Time"]),
    }


def check_bit_identity(url: str, bodies: Path, n: int, clients: int) -> dict:
    """The first ``n`` pairs scored one at a time, then all at once from ``clients`` threads
    (micro-batched): every field of every response must be equal."""
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    lines = open(bodies, "rb").read().splitlines()[:n]

    def post(b):
        return httpx.post(
            url + "/v1/score", content=b, timeout=600, headers={"content-type": "application/json"}
        ).json()

    alone = [post(b) for b in lines]
    before = scrape(url)
    with ThreadPoolExecutor(clients) as ex:
        together = list(ex.map(post, lines))
    after = scrape(url)
    batches = after["masc_batch_size_count"] - before["masc_batch_size_count"]
    return {
        "pairs": len(lines),
        "clients": clients,
        "batches": batches,
        "mean_batch_size": len(lines) / batches,
        "bit_identical": alone == together,
        "max_abs_dcp": max(abs(a["cp"] - b["cp"]) for a, b in zip(alone, together)),
    }


def scrape(url: str) -> dict:
    import httpx

    text = httpx.get(url + "/metrics", timeout=10).text
    out = {}
    for line in text.splitlines():
        if line.startswith(
            (
                "masc_batch_size_sum",
                "masc_batch_size_count",
                "masc_reference_cache_hits_total",
                "masc_reference_cache_misses_total",
            )
        ):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


def main() -> None:
    from masc_engine.cli.logs import show_library_log

    show_library_log()  # the export's stage lines on stderr
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", default=str(REPO / "out" / "bench-serve"))
    ap.add_argument("--bundle", default=None, help="default: export random:base-naflex (budget --budget) into --work")
    ap.add_argument("--budget", type=int, default=256, help="NaFlex patch budget the server runs with")
    ap.add_argument("--seconds", type=int, default=40, help="locust run time per level")
    ap.add_argument("--levels", default=",".join(map(str, LEVELS)))
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--max-wait-ms", type=float, default=10.0)
    ap.add_argument("--pairs", type=int, default=None, help="use only the first N shared pairs")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "serve_load.json"))
    a = ap.parse_args()
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    bundle = Path(a.bundle) if a.bundle else work / f"base-naflex-{a.budget}"
    if not (bundle / "manifest.json").is_file():
        from masc_engine.export.exporter import export_bundle

        export_bundle("random:base-naflex", bundle, max_num_patches=a.budget)
    bodies = work / "bodies.jsonl"
    n_pairs, n_refs = build_bodies(bodies, a.pairs)
    manifest = json.loads((bundle / "manifest.json").read_text())
    levels = [int(x) for x in a.levels.split(",")]
    import fastapi
    import locust
    import onnxruntime
    import uvicorn

    from masc_engine import __version__

    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "cpu": next(
                (ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "unknown"
            ),
            "cores": os.cpu_count(),
            "python": platform.python_version(),
        },
        "versions": {
            "masc_engine": __version__,
            "onnxruntime": onnxruntime.__version__,
            "fastapi": fastapi.__version__,
            "uvicorn": uvicorn.__version__,
            "locust": locust.__version__,
        },
        "model": f"{manifest['source'].get('model')}, NaFlex budget {a.budget} (--max-num-patches)",
        "traffic": f"{n_pairs} DreamBooth pairs ({n_refs} references), JSON base64, round-robin per client",
        "note": "loopback; locust runs on the same cores as the server (see loadavg per run)",
        "loadavg_start": os.getloadavg(),
        "runs": [],
    }
    for max_batch in (a.max_batch, 1):
        proc, url = start_server(bundle, max_batch, a.max_wait_ms, a.budget, work / f"server-b{max_batch}.log")
        try:
            if max_batch > 1:
                result["bit_identity"] = check_bit_identity(url, bodies, 32, 16)
                print(json.dumps(result["bit_identity"]), flush=True)
            for users in levels:
                before = scrape(url)
                load = os.getloadavg()
                r = run_locust(url, users, a.seconds, bodies, work / f"locust-b{max_batch}-u{users}")
                after = scrape(url)
                batches = after.get("masc_batch_size_count", 0) - before.get("masc_batch_size_count", 0)
                items = after.get("masc_batch_size_sum", 0) - before.get("masc_batch_size_sum", 0)
                r.update(
                    max_batch=max_batch,
                    max_wait_ms=a.max_wait_ms,
                    loadavg_before=load,
                    mean_batch_size=items / batches if batches else None,
                )
                r["server_rss_mb"], r["server_peak_rss_mb"] = rss_mb(proc.pid)
                print(json.dumps(r), flush=True)
                result["runs"].append(r)
            cache = scrape(url)
            result.setdefault("cache", {})[f"max_batch_{max_batch}"] = cache
        finally:
            proc.send_signal(signal.SIGTERM)
            result.setdefault("exit_status", {})[f"max_batch_{max_batch}"] = proc.wait(60)
    by = {(r["max_batch"], r["clients"]): r for r in result["runs"]}
    result["gain_over_max_batch_1"] = {
        str(u): round(by[(a.max_batch, u)]["requests_per_s"] / by[(1, u)]["requests_per_s"], 3)
        for u in levels
        if by[(1, u)]["requests_per_s"]
    }
    result["loadavg_end"] = os.getloadavg()
    Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    write_markdown(result, Path(a.out).with_suffix(".md"))
    print(Path(a.out).with_suffix(".md").read_text())


def write_markdown(res: dict, path: Path) -> None:
    m = res["machine"]
    lines = [
        "# masc-serve under load (bench/serve_load.py)",
        "",
        f"Measured {res['date']} on {m['cpu']}, {m['cores']} cores, Python {m['python']}; "
        + ", ".join(f"{k} {v}" for k, v in res["versions"].items())
        + ".",
        f"Model: {res['model']}. Traffic: {res['traffic']}. Locust closed loop (no think time), "
        "one level after another on the same server process.",
        f"Note: {res['note']}. Load average at start {tuple(round(x, 2) for x in res['loadavg_start'])}, "
        f"at end {tuple(round(x, 2) for x in res['loadavg_end'])}. Raw figures: `serve_load.json`.",
        "",
        "| --max-batch | clients | requests | errors | req/s | p50 ms | p99 ms | mean batch | server peak RSS MiB | load avg before |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in res["runs"]:
        mb = f"{r['mean_batch_size']:.2f}" if r["mean_batch_size"] else "-"
        lines.append(
            f"| {r['max_batch']} | {r['clients']} | {r['requests']} | {r['failures']} | "
            f"{r['requests_per_s']:.2f} | {r['p50_ms']:.0f} | {r['p99_ms']:.0f} | {mb} | "
            f"{r['server_peak_rss_mb']:.0f} | {r['loadavg_before'][0]:.2f} |"
        )
    bi = res.get("bit_identity")
    if bi:
        lines += [
            "",
            f"Bit identity: {bi['pairs']} pairs scored one at a time, then all at once from {bi['clients']} "
            f"clients ({bi['batches']:.0f} micro-batches, mean size {bi['mean_batch_size']:.2f}): "
            f"{'every response equal, field for field' if bi['bit_identical'] else 'DIFFERENT'} "
            f"(max |dCP| {bi['max_abs_dcp']:.1e}).",
        ]
    lines += [
        "",
        "Throughput gain of micro-batching over `--max-batch 1`, by clients: "
        + ", ".join(f"{k}: {v}x" for k, v in res["gain_over_max_batch_1"].items())
        + ".",
        f"Server exit status after SIGTERM: {res['exit_status']}.",
        "",
    ]
    path.write_text("\n".join(lines))


if __name__ == "__main__":
    main()
