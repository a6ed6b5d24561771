"""The runtime's install footprint and import time, as a new user meets them.

A fresh venv (``python -m venv``, pip included) gets ``pip install <checkout>`` (the runtime only:
no extra); then its size is measured with ``du -sk`` over the whole venv, its largest packages
listed, and ``from masc_engine import MaSC`` timed in fresh interpreters (median of --repeats).
Targets: <= 250 MB, < 0.5 s. The same for ``[parquet]`` on top, to show what the extra costs.

    python bench/install_footprint.py --out bench/results/install_footprint.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def du_mb(path: Path) -> float:
    return int(subprocess.check_output(["du", "-sk", str(path)], text=True).split()[0]) / 1024


def largest(site: Path, n: int = 8) -> list[list]:
    sizes = [(p.name, du_mb(p)) for p in site.iterdir() if p.is_dir() and not p.name.endswith(".dist-info")]
    return [[k, round(v, 1)] for k, v in sorted(sizes, key=lambda t: -t[1])[:n]]


def import_seconds(py: Path, repeats: int) -> tuple[list[float], list[float]]:
    """Wall and CPU (user + sys of the process) seconds of the import, fresh interpreter each time.
    On a loaded machine wall time waits for a core; CPU time is the import's own cost."""
    code = (
        "import time; t, c = time.perf_counter(), time.process_time(); from masc_engine import MaSC; "
        "print(time.perf_counter() - t, time.process_time() - c)"
    )
    wall, cpu = [], []
    for _ in range(repeats):
        w, c = subprocess.check_output([str(py), "-c", code], text=True, cwd="/").split()
        wall.append(float(w))
        cpu.append(float(c))
    return wall, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(REPO / "bench/results/install_footprint.json"))
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    record = {
        "what": "fresh venv + pip install <checkout> (runtime, no extra): du of the whole venv, "
        "import time of `from masc_engine import MaSC` (fresh interpreter each)",
        "script": "bench/install_footprint.py",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "loadavg_1_5_15_start": list(os.getloadavg()),
            "note": "shared 2-core machine: other jobs ran at the same time (import times are upper bounds)",
        },
        "versions": {"python": platform.python_version(), "pip_freeze": "see runtime.pip_freeze"},
        "targets": {"venv_mb": 250, "import_s": 0.5},
    }
    with tempfile.TemporaryDirectory() as d:
        venv = Path(d) / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        py = venv / "bin" / "python"
        record["empty_venv_mb"] = round(du_mb(venv), 1)
        subprocess.run([str(py), "-m", "pip", "install", "-q", str(REPO)], check=True)
        site = next((venv / "lib").glob("python*/site-packages"))
        freeze = subprocess.check_output([str(py), "-m", "pip", "freeze"], text=True).split()
        import_seconds(py, 1)  # warm the page cache once (a first run also reads every .pyc from disk)
        t, c = import_seconds(py, args.repeats)
        record["runtime"] = {
            "venv_mb": round(du_mb(venv), 1),
            "largest_packages_mb": largest(site),
            "pip_freeze": freeze,
            "import_s_median": round(statistics.median(t), 3),
            "import_s_all": [round(x, 3) for x in t],
            "import_cpu_s_median": round(statistics.median(c), 3),
            "import_cpu_s_all": [round(x, 3) for x in c],
            "torch_installed": any(f.lower().startswith("torch") for f in freeze),
            "pyarrow_installed": any(f.lower().startswith("pyarrow") for f in freeze),
        }
        subprocess.run([str(py), "-m", "pip", "install", "-q", f"{REPO}[parquet]"], check=True)
        record["runtime_plus_parquet"] = {"venv_mb": round(du_mb(venv), 1), "largest_packages_mb": largest(site, 3)}
    record["machine"]["loadavg_1_5_15_end"] = list(os.getloadavg())
    r = record["runtime"]
    record["meets_targets"] = r["venv_mb"] <= 250 and r["import_s_median"] < 0.5
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    print(
        json.dumps(
            {
                k: record["runtime"][k]
                for k in ("venv_mb", "import_s_median", "import_cpu_s_median", "largest_packages_mb")
            }
        )
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
