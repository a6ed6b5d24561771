#!/usr/bin/env python
"""Extract the ONNX ops TensorRT's ONNX parser imports from onnx-tensorrt's sources.

The list is read from the parser's source, not its documentation: every
``DEFINE_BUILTIN_OP_IMPORTER(Name)`` of ``onnxOpImporters.cpp`` at a git ref of a local clone of
github.com/onnx/onnx-tensorrt, less the parser's own ``TRT_*`` ops and its helper importers
(``FallbackPluginImporter``, ``LocalFunctionImporter``). The result
(tests/data/onnx_tensorrt_ops.json: ref, commit, ops) is what tests/doubles/fake_tensorrt.py's parser
accepts.

Usage (repo root)::

    python scripts/extract_onnx_trt_ops.py --repo PATH/onnx-tensorrt.git --ref 10.1-GA
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "tests" / "data" / "onnx_tensorrt_ops.json"
HELPERS = {"FallbackPluginImporter", "LocalFunctionImporter", "op"}


def importer_ops(source: str) -> list[str]:
    """ONNX op names registered by ``DEFINE_BUILTIN_OP_IMPORTER`` in ``source`` (sorted)."""
    names = set(re.findall(r"DEFINE_BUILTIN_OP_IMPORTER\(\s*([A-Za-z0-9_]+)\s*\)", source))
    return sorted(n for n in names if n not in HELPERS and not n.startswith("TRT_"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", type=Path, required=True, help="a clone (or bare git dir) of onnx/onnx-tensorrt")
    ap.add_argument("--ref", default="10.1-GA", help="branch, tag or commit of the parser release")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    git = (
        ["git", "--git-dir", str(args.repo)]
        if args.repo.name.endswith(".git") or (args.repo / "HEAD").is_file()
        else ["git", "-C", str(args.repo)]
    )
    commit = subprocess.run([*git, "rev-parse", args.ref], capture_output=True, text=True, check=True).stdout.strip()
    source = subprocess.run(
        [*git, "show", f"{commit}:onnxOpImporters.cpp"], capture_output=True, text=True, check=True
    ).stdout
    ops = importer_ops(source)
    args.out.write_text(
        json.dumps(
            {
                "source": "github.com/onnx/onnx-tensorrt onnxOpImporters.cpp",
                "ref": args.ref,
                "commit": commit,
                "ops": ops,
            },
            indent=1,
        )
        + "\n"
    )
    print(f"{len(ops)} ops from onnx-tensorrt {args.ref} ({commit[:12]}) -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
