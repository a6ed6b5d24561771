"""The ONNX checker on every graph of a bundle, before the bundle is kept.

``onnx.checker.check_model(path, full_check=True)`` checks each graph against the ONNX spec:
nodes in topological order, every node's schema for its opset (ops of other domains, such as
the fused ``ort-cpu`` graphs' ``com.microsoft`` ops, are checked for well-formedness only: the
checker has no schema for them), and strict type and shape inference. Tools that check first
(onnx-simplifier, Polygraphy, netron's loader, ``trtexec --onnx`` through the parser's
checker) refuse a graph that fails it, so a bundle whose graphs fail it is not written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from ..errors import ExportValidationError


def check_graphs(bundle_dir: str | Path, files: Iterable[str]) -> list[str]:
    """Run the full ONNX check on each ``.onnx`` file among ``files`` (a bundle's file list).

    The check takes the path, so graphs with external weights (so400m) are checked without
    loading the 2 GiB protobuf limit's worth of weights into one message.

    Returns:
        the graph files checked.

    Raises:
        ExportValidationError: one or more graphs fail; the message names each file and the
            checker's first line; ``report`` maps file to the full message.
    """
    import onnx

    checked, failures = [], {}
    for name in sorted(f for f in files if f.endswith(".onnx")):
        try:
            onnx.checker.check_model(str(Path(bundle_dir) / name), full_check=True)
        except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
            failures[name] = str(e)
        checked.append(name)
    if failures:
        lines = "; ".join(f"{n}: {m.strip().splitlines()[0] if m.strip() else m}" for n, m in failures.items())
        raise ExportValidationError(
            f"{len(failures)} graph(s) fail onnx.checker.check_model(full_check=True), so the "
            f"bundle is not kept: {lines}",
            report=failures,
        )
    return checked
