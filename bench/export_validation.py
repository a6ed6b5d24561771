"""Export-validation error (ONNX Runtime CPU vs PyTorch, fp32) at the tiny, base and so400m shapes.

The figures behind ``tolerances.EXPORT_VALIDATION_BUDGETS``: for each random-weight preset
(export/random_models.py) the bundle is exported without validation, then every check of
export/validate.py (vision on NaFlex grids other than the traced one, batch 1 and a mixed batch;
pool; text) is run and its max / mean / p99 absolute error recorded (a check past today's budget
is recorded, not raised). Error grows with depth (tiny: 2 layers, base: 12, so400m: 27), so each
shape gets its own budget.

Each preset runs in its own child process (the so400m export holds ~10 GB). Heavy: run under
``flock /tmp/masc-heavy.lock`` on a shared machine. The bundles stay in ``--work`` (reused by
bench/memory.py).

    flock /tmp/masc-heavy.lock python bench/export_validation.py --out bench/results/export_validation.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PRESETS = ["tiny-naflex", "tiny-fixed", "base-naflex", "so400m-naflex"]


def measure(preset: str, work: Path) -> dict:
    """Export ``random:<preset>`` to ``work/<preset>`` and run every export check, measuring only."""
    from masc_engine.engine.backends.onnxruntime import OrtRunner
    from masc_engine.errors import ExportValidationError
    from masc_engine.export import exporter
    from masc_engine.export import validate as val

    out = work / preset
    t0 = time.time()
    if not (out / "manifest.json").is_file():
        exporter.export_bundle(f"random:{preset}", out, validate=False)
    export_s = time.time() - t0
    manifest = json.loads((out / "manifest.json").read_text())
    m, processor, _ = exporter._load(f"random:{preset}", None)
    image, text = manifest["image"], manifest["text"]
    checks = {
        "vision": lambda: val.validate_vision(OrtRunner(out / "vision.onnx", "vision"), m, processor, image),
        "pool": lambda: val.validate_pool(OrtRunner(out / "pool.onnx", "pool"), m),
        "text": lambda: val.validate_text(OrtRunner(out / "text.onnx", "text"), m, processor, text, out),
    }
    res = {
        "preset": preset,
        "vision_layers": int(m.vision_model.config.num_hidden_layers),
        "vision_width": int(m.vision_model.config.hidden_size),
        "text_layers": int(m.text_model.config.num_hidden_layers),
        "max_num_patches": image.get("max_num_patches"),
        "export_seconds": round(export_s, 1),
        "graphs": {},
    }
    for name, fn in checks.items():
        try:
            rep = fn()
        except ExportValidationError as e:  # past today's budget: record the figures anyway
            rep = dict(e.report, exceeded_budget=True)
        cases = rep["cases"]
        res["graphs"][name] = {
            "max_abs": max(c["max_abs"] for c in cases),
            "mean_abs": max(c["mean_abs"] for c in cases),
            "p99_abs": max(c["p99_abs"] for c in cases),
            "max_rel": max(c["max_rel"] for c in cases),
            "budget_at_run": rep.get("atol"),
            "cases": len(cases),
            "exceeded_budget": bool(rep.get("exceeded_budget", False)),
        }
    return res


def main() -> None:
    from masc_engine.cli.logs import show_library_log

    show_library_log()  # the export's stage lines on stderr
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(REPO / "bench/results/export_validation.json"))
    ap.add_argument("--work", default="/tmp/masc-export-validation")
    ap.add_argument("--presets", default=",".join(PRESETS))
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    if args.child:
        print(json.dumps(measure(args.child, work)))
        return
    import onnxruntime
    import torch
    import transformers

    import masc_engine

    results = []
    for preset in args.presets.split(","):
        print(f"== {preset}", file=sys.stderr, flush=True)
        proc = subprocess.run(
            [sys.executable, __file__, "--work", str(work), "--child", preset],
            stdout=subprocess.PIPE,
            text=True,
            check=True,
        )
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(json.dumps(results[-1]["graphs"]), file=sys.stderr, flush=True)
    record = {
        "what": "export validation max |error|, ONNX Runtime CPU fp32 vs PyTorch fp32, random weights",
        "script": "bench/export_validation.py",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "loadavg_1_5_15": list(os.getloadavg()),
            "note": "shared 2-core machine: other jobs ran at the same time",
        },
        "versions": {
            "python": platform.python_version(),
            "masc_engine": masc_engine.__version__,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "onnxruntime": onnxruntime.__version__,
        },
        "presets": results,
    }
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
