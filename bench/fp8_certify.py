"""Certify an FP8 (E4M3 explicit Q/DQ) vision tower of a bundle on ONNX Runtime CPU and record
the figures (export/fp8.py ``certify_fp8``: cpu_precision's default calibration and held-out
pairs, gates of tolerances.py); a refusal is recorded with its figures too.

Usage: python bench/fp8_certify.py --model random:tiny-naflex --out bench/results/fp8_tiny_certificate.json
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import tempfile
import time
from pathlib import Path


def _machine() -> dict:
    """bench/workloads.py ``machine``: CPU model, ISA flags, cores, memory, library versions."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import workloads

    return {
        **workloads.machine(("numpy", "onnx", "onnxruntime")),
        "loadavg_1_5_15": list(__import__("os").getloadavg()),
    }


def main(argv=None) -> int:
    from masc_engine.export.cpu_precision import CertificationError
    from masc_engine.export.exporter import export_bundle
    from masc_engine.export.fp8 import certify_fp8

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="random:tiny-naflex")
    ap.add_argument("--max-num-patches", type=int, default=None)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--note", default="", help="what else ran on the machine (recorded)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="fp8-"))
    lines: list[str] = []
    handler = logging.StreamHandler(sys.stdout)  # the certification's lines, shown and recorded
    handler.emit = lambda r: (lines.append(r.getMessage()), print(r.getMessage(), flush=True))
    logging.getLogger("masc_engine.export").addHandler(handler)
    logging.getLogger("masc_engine").setLevel(logging.INFO)
    t0 = time.time()
    try:
        export_bundle(args.model, work / "fp32", max_num_patches=args.max_num_patches)
        try:
            record = certify_fp8(work / "fp32", work / "fp8", threads=args.threads)
            result = {"certified": True, "precision": record}
        except CertificationError as e:
            result = {"certified": False, "refusal": str(e), "report": e.report}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result.update(
        script="bench/fp8_certify.py",
        date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        machine=_machine(),
        model=args.model,
        max_num_patches=args.max_num_patches,
        note=args.note or "not stated",
        seconds=round(time.time() - t0, 1),
        log=lines,
    )
    args.out.write_text(json.dumps(result, indent=1, default=float) + "\n")
    print(f"written {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
