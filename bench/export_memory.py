"""Memory of ``masc-export`` stage by stage: peak RSS of the process tree per stage, and bundle size per target.

Runs ``masc-export`` (``python -m masc_engine.cli.export_cmd``, under GNU ``/usr/bin/time -v`` when
present) in a child process per precision and samples the resident set size of the child's whole
process tree (the exporter and its PyTorch worker) every ``--interval`` seconds from ``/proc``. The
exporter prints one line per stage as it completes, ending ``[<stage>: <s> s, peak <p> GB, now <n>
GB<where>]`` (export/stages.py); each sample is attributed to the stage in progress (the one whose
line comes next), so each stage gets the tree's peak while it ran, beside the stage's own figure.
Also recorded: the tree's overall peak, ``/usr/bin/time``'s "Maximum resident set size" (the
largest single process), wall time, and the bundle's size on disk per target: ``cpu`` (what
masc-run on CPU loads: the fused ``ort-cpu`` vision and text graphs, the pool and CP graphs, their
weight files), ``gpu`` (the portable graphs: TensorRT and ONNX Runtime CUDA), ``all`` (every file).

``--compare-scores`` also scores the shipped pairs (examples/dreambooth) with the new bundle and
with the same bundle laid out as exports wrote it before its graphs shared weight files (a full
copy of the weights per fused graph), in two child processes, and records max |dCP|, |dPF|.

The machine may be shared: ``--kill-above-gb`` is a watchdog that kills the export's process tree
when its RSS passes that many GB (recorded as ``killed``); run one so400m export at a time. The
results file records the load averages before and after each run.

    python bench/export_memory.py --model random:so400m-naflex --precisions fp32,fp16 \\
        --kill-above-gb 12 --compare-scores --out bench/results/export_memory_so400m.json
    python bench/export_memory.py --model random:tiny-naflex --out /tmp/export_memory_tiny.json  # a check
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples" / "dreambooth"
GB = 1e9
#: The end of a stage line (export/stages.py StageClock.record).
STAGE_LINE = re.compile(
    r"\[(?P<stage>[^:\[\]]+): (?P<seconds>[\d.]+) s, peak (?P<peak>[\d.]+) GB, "
    r"now (?P<now>[\d.]+) GB(?: \((?P<where>[^)]*)\))?\]$"
)


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        kids.setdefault(ppid, []).append(int(d))
    return kids


def tree_rss(pid: int) -> tuple[int, dict[int, int]]:
    """(total RSS in bytes of ``pid`` and its descendants, {pid: RSS})."""
    kids, todo, per = _children(), [pid], {}
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        per[p] = int(line.split()[1]) * 1024
                        break
        except OSError:
            pass
        todo.extend(kids.get(p, []))
    return sum(per.values()), per


class Sampler(threading.Thread):
    """Samples the process tree's RSS; attributes each sample to the stage in progress; kills the
    tree past ``kill_above`` bytes."""

    def __init__(self, pid: int, interval: float, kill_above: float | None):
        super().__init__(daemon=True)
        self.pid, self.interval, self.kill_above = pid, interval, kill_above
        self.stage_peak, self.stage_procs, self.peak, self.killed = 0, 0, 0, None
        self.lock = threading.Lock()
        self.done = threading.Event()

    def next_stage(self) -> tuple[int, int]:
        """The tree's peak (and its process count then) since the last call; starts the next stage."""
        with self.lock:
            out = (self.stage_peak, self.stage_procs)
            self.stage_peak = self.stage_procs = 0
        return out

    def run(self) -> None:
        while not self.done.is_set():
            total, per = tree_rss(self.pid)
            with self.lock:
                if total > self.stage_peak:
                    self.stage_peak, self.stage_procs = total, len(per)
                self.peak = max(self.peak, total)
            if self.kill_above is not None and total > self.kill_above and self.killed is None:
                self.killed = {"tree_rss_gb": round(total / GB, 2), "at": time.strftime("%H:%M:%S")}
                try:
                    os.killpg(self.pid, signal.SIGKILL)
                except OSError:
                    pass
            self.done.wait(self.interval)


def _time_max_rss_kb(path: Path) -> int | None:
    if not path.is_file():
        return None
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", path.read_text())
    return int(m.group(1)) if m else None


def export_once(model: str, precision: str, out: Path, args) -> dict:
    """One ``masc-export`` run under the sampler; returns its record."""
    shutil.rmtree(out, ignore_errors=True)
    cmd = [
        sys.executable,
        "-m",
        "masc_engine.cli.export_cmd",
        "--model",
        model,
        "--out",
        str(out),
        "--precision",
        precision,
    ] + (["--max-num-patches", str(args.max_num_patches)] if args.max_num_patches else [])
    if precision == "int8":  # int8 is kept only if it passes its gates on pairs (masc-export refuses without)
        cmd += ["--gate-pairs", str(args.gate_pairs)]
    time_file = out.with_name(out.name + ".time.txt")
    if shutil.which("time") or Path("/usr/bin/time").is_file():
        cmd = ["/usr/bin/time", "-v", "-o", str(time_file)] + cmd
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "src")] + [os.environ.get("PYTHONPATH", "")]))
    load_before = os.getloadavg()
    t0 = time.time()
    proc = subprocess.Popen(
        cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env, start_new_session=True
    )
    sampler = Sampler(proc.pid, args.interval, args.kill_above_gb * GB if args.kill_above_gb else None)
    sampler.start()
    stages, lines = [], []
    for line in proc.stderr:
        line = line.rstrip("\n")
        lines.append(line)
        print(line, file=sys.stderr, flush=True)
        m = STAGE_LINE.search(line)
        if m:
            tree_peak, procs = sampler.next_stage()
            stages.append(
                {
                    "stage": m["stage"],
                    "seconds": float(m["seconds"]),
                    "process": m["where"] or "exporter",
                    "stage_peak_rss_gb": float(m["peak"]),
                    "rss_gb_after": float(m["now"]),
                    "tree_peak_rss_gb": round(tree_peak / GB, 3),
                    "tree_processes_at_peak": procs,
                }
            )
    code = proc.wait()
    sampler.done.set()
    sampler.join()
    rec = {
        "model": model,
        "precision": precision,
        "exit_code": code,
        "wall_s": round(time.time() - t0, 1),
        "tree_peak_rss_gb": round(sampler.peak / GB, 3),
        "killed_by_watchdog": sampler.killed,
        "time_v_max_rss_gb": None,
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "stages": stages,
    }
    kb = _time_max_rss_kb(time_file)
    if kb is not None:
        rec["time_v_max_rss_gb"] = round(kb * 1024 / GB, 3)
    plan = [ln for ln in lines if ln.startswith("memory plan:")]
    rec["memory_plan_line"] = plan[0] if plan else None
    if code != 0:
        rec["last_lines"] = lines[-5:]
    elif (out / "manifest.json").is_file():
        rec["bundle"] = bundle_sizes(out)
    return rec


def bundle_sizes(bundle: Path) -> dict:
    """Bytes on disk per target (see the module docstring) and per file."""
    m = json.loads((bundle / "manifest.json").read_text())
    sizes = {name: (bundle / name).stat().st_size for name in m["files"]}

    def files_of(variant: str | None) -> set:
        out = {"tokenizer.json", "manifest.json"}
        for entry in m["graphs"].values():
            e = entry.get("variants", {}).get(variant, entry) if variant else entry
            out.add(e["file"])
            out.update(e.get("external_data", [e["file"] + ".data"] if (e["file"] + ".data") in sizes else []))
        return out

    total = lambda names: sum(sizes.get(n, 0) for n in names) + (bundle / "manifest.json").stat().st_size  # noqa: E731
    fused = "ort-cpu" if m.get("variants", {}).get("ort-cpu") else None  # CPU runs the fused graphs when present
    targets = {"all": total(set(sizes)), "cpu": total(files_of(fused)), "gpu": total(files_of(None))}
    return {
        "bytes_by_target": targets,
        "gb_by_target": {k: round(v / GB, 3) for k, v in targets.items()},
        "files": sizes,
    }


def compare_scores(bundle: Path, work: Path) -> dict:
    """Shipped pairs scored by ``bundle`` and by the same bundle with a full copy of the weights per
    graph (as exports wrote it before the fused graphs shared the portable graphs' weight files)."""
    old = work / "one-copy-per-graph"
    shutil.rmtree(old, ignore_errors=True)
    _one_copy_per_graph(bundle, old)
    got = {}
    for name, b in (("shared", bundle), ("one_copy_per_graph", old)):
        out = work / f"scores-{name}.csv"
        out.unlink(missing_ok=True)
        for f in work.glob(f"scores-{name}.csv*"):
            f.unlink()
        env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
        t0 = time.time()
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "masc_engine.cli.run_cmd",
                str(EXAMPLES / "pairs.csv"),
                "--bundle",
                str(b),
                "--out",
                str(out),
                "--no-progress",
            ],
            env=env,
        )
        _, status, usage = os.wait4(proc.pid, 0)  # ru_maxrss of this masc-run alone (kB)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode:
            raise SystemExit(f"masc-run on {b} failed ({proc.returncode})")
        import csv

        rows = list(csv.DictReader(open(out, newline="", encoding="utf-8")))
        got[name] = {
            "cp": [float(r["cp"]) for r in rows],
            "pf": [float(r["pf"]) for r in rows],
            "seconds": round(time.time() - t0, 1),
            "peak_rss_gb": round(usage.ru_maxrss * 1024 / GB, 3),
        }
    a, b = got["shared"], got["one_copy_per_graph"]
    d = lambda k: max(abs(x - y) for x, y in zip(a[k], b[k], strict=True))  # noqa: E731
    sizes = {"shared": bundle_sizes(bundle)["gb_by_target"], "one_copy_per_graph": bundle_sizes(old)["gb_by_target"]}
    shutil.rmtree(old, ignore_errors=True)
    return {
        "pairs": len(a["cp"]),
        "max_abs_dcp": d("cp"),
        "max_abs_dpf": d("pf"),
        "gb_by_target": sizes,
        "masc_run_seconds": {k: v["seconds"] for k, v in got.items()},
        "masc_run_peak_rss_gb": {k: v["peak_rss_gb"] for k, v in got.items()},
    }


def _one_copy_per_graph(bundle: Path, dst: Path) -> None:
    """``bundle`` with its fused graphs re-fused into another folder (nothing shared: packed QKV and
    every weight in their own ``.data``), as exports wrote them before."""
    sys.path.insert(0, str(REPO / "src"))
    from masc_engine.engine.manifest import read_manifest, write_manifest
    from masc_engine.export.fusion import fuse_graph

    shutil.copytree(bundle, dst)
    m = read_manifest(bundle)
    rec = {r["graph"]: r for r in m["transforms"] if r["transform"] == "ort-fusion"}
    apart = dst / "apart"
    apart.mkdir()
    for g, r in rec.items():
        t = r["settings"]["towers"][g]
        fused = f"{g}.ort-cpu.onnx"
        fuse_graph(bundle / f"{g}.onnx", apart / fused, t["num_heads"], t["hidden_size"])
        for f in (fused, fused + ".data"):
            shutil.move(str(apart / f), str(dst / f))
        m["graphs"][g]["variants"]["ort-cpu"]["external_data"] = [fused + ".data"]
    apart.rmdir()
    m["files"] = sorted(p.name for p in dst.iterdir() if p.name != "manifest.json")
    write_manifest(dst, m)


def _machine() -> dict:
    mem = None
    try:
        mem = int(next(ln for ln in open("/proc/meminfo") if ln.startswith("MemTotal")).split()[1]) * 1024
    except (OSError, StopIteration):
        pass
    from importlib.metadata import PackageNotFoundError, version

    versions = {}
    for dist in ("masc-engine", "onnxruntime", "onnx", "torch", "transformers"):
        try:
            versions[dist.replace("-", "_")] = version(dist)
        except PackageNotFoundError:
            pass
    return {
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "mem_total_gb": round(mem / GB, 1) if mem else None,
        "python": platform.python_version(),
        "versions": versions,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="random:so400m-naflex")
    ap.add_argument("--precisions", default="fp32", help="comma-separated: fp32,fp16,bf16")
    ap.add_argument("--max-num-patches", type=int, default=None)
    ap.add_argument("--work", default="/tmp/masc-export-memory")
    ap.add_argument("--interval", type=float, default=0.25, help="RSS sampling period, seconds")
    ap.add_argument(
        "--kill-above-gb",
        type=float,
        default=12.0,
        help="watchdog: kill the export's process tree past this RSS (0: off)",
    )
    ap.add_argument(
        "--compare-scores",
        action="store_true",
        help="score the shipped pairs with the fp32 bundle and with a one-copy-per-graph layout of it",
    )
    ap.add_argument("--keep", action="store_true", help="keep the bundles under --work")
    ap.add_argument(
        "--gate-pairs",
        default=str(REPO / "examples" / "dreambooth" / "pairs.csv"),
        help="int8: the pairs its gates score (masc-export --gate-pairs)",
    )
    ap.add_argument(
        "--compare-bundle",
        default=None,
        help="only --compare-scores on this existing bundle (no export); added to --out's runs",
    )
    ap.add_argument("--note", default="", help="free text recorded in the results (e.g. the machine's state)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    res = {
        "script": "bench/export_memory.py",
        "argv": sys.argv[1:] if argv is None else list(argv),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": _machine(),
        "note": args.note,
        "kill_above_gb": args.kill_above_gb or None,
        "runs": [],
    }
    if args.compare_bundle:
        prev = json.loads(Path(args.out).read_text()) if Path(args.out).is_file() else res
        fp32 = next((r for r in prev["runs"] if r["precision"] == "fp32"), None)
        target = fp32 if fp32 is not None else {"precision": "fp32", "exit_code": 0}
        target["scores_vs_one_copy_per_graph"] = compare_scores(Path(args.compare_bundle), work)
        target["scores_vs_one_copy_per_graph"]["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
        if fp32 is None:
            prev["runs"].append(target)
        Path(args.out).write_text(json.dumps(prev, indent=2) + "\n")
        return 0
    for precision in [p for p in args.precisions.split(",") if p]:
        out = work / f"bundle-{precision}"
        rec = export_once(args.model, precision, out, args)
        if precision == "fp32" and args.compare_scores and rec["exit_code"] == 0:
            rec["scores_vs_one_copy_per_graph"] = compare_scores(out, work)
        res["runs"].append(rec)
        if not args.keep:
            shutil.rmtree(out, ignore_errors=True)
        Path(args.out).write_text(json.dumps(res, indent=2) + "\n")  # after each run: a killed bench keeps it
    print(
        json.dumps(
            [
                {k: r.get(k) for k in ("precision", "exit_code", "wall_s", "tree_peak_rss_gb", "time_v_max_rss_gb")}
                for r in res["runs"]
            ],
            indent=1,
        )
    )
    return 0 if all(r["exit_code"] == 0 for r in res["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
