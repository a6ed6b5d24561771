"""The export-time graph-transform pipeline: ordered ONNX rewrites, each validated and recorded.

After ``masc-export`` has written the portable fp32 graphs and validated them against PyTorch,
it runs an ordered list of :class:`GraphTransform` s over them. For each transform and each graph
it applies to, :func:`run_transforms`:

1. reads the graph's current file (the output of the previous transform that replaced it, or the
   exported fp32 graph) and has the transform write a new ONNX file;
2. validates the new file against PyTorch right away, with the gates the transform names
   (``"fp32"``: the per-shape budgets ``tolerances.EXPORT_VALIDATION_BUDGETS``; ``"fp16"`` / ``"bf16"``: the
   reduced-precision gates in :mod:`masc_engine.tolerances`), through the ``validate`` callable
   the exporter passes in (it holds the PyTorch model; export/validate.py does the checks); a
   failure raises and nothing becomes a bundle;
3. records what happened in the manifest's ``transforms`` list: transform name, settings, graph,
   file written, node counts per op type before and after, the transform's own facts and the
   validation report.

A transform either **replaces** the bundle's graph (``variant = None``: e.g. the fp16 conversion,
whose output is the graph every backend then runs) or writes an **additional variant** beside it
(``variant = "ort-cpu"``: ONNX Runtime's transformer fusions, export/fusion.py, whose contrib ops
TensorRT cannot parse), recorded under ``graphs[<graph>]["variants"][<variant>]`` in the manifest while the
portable graph stays in place.

Writing a transform: a small class with the four attributes and ``apply`` below; no base class is
needed (:class:`GraphTransform` is a ``typing.Protocol``). Example::

    class MyFusion:
        name = "ort-fusion"
        variant = "ort-cpu"            # or None to replace the graph
        gates = "fp32"                 # validation gates for the result
        graphs = ("vision", "text")

        def settings(self) -> dict:
            return {"opt_level": 1}

        def apply(self, graph: str, src: Path, dst: Path) -> dict:
            ...                        # read src, write dst (ONNX), return facts for the manifest
            return {"fused_nodes": 12}
"""

from __future__ import annotations

import logging
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Protocol, Sequence, runtime_checkable

logger = logging.getLogger(__name__)

#: Validation gates a transform may ask for (export/validate.py implements each).
GATES = ("fp32", "fp16", "bf16")


@runtime_checkable
class GraphTransform(Protocol):
    """One export-time ONNX rewrite (see the module docstring).

    Attributes:
        name: short identifier recorded in the manifest (``"precision-fp16"``, ``"ort-fusion"``).
        variant: ``None`` to replace the bundle's graph file, or the name of an additional variant
            written to ``<graph>.<variant>.onnx``.
        gates: the validation gates of the result, one of :data:`GATES`.
        graphs: the bundle graphs (``vision``, ``pool``, ``text``, ``cp``) it applies to.
    """

    name: str
    variant: str | None
    gates: str
    graphs: tuple[str, ...]

    def settings(self) -> dict:
        """JSON-serialisable settings, recorded in the manifest."""

    def apply(self, graph: str, src: Path, dst: Path) -> dict:
        """Read the ONNX file ``src``, write the transformed graph to ``dst``.

        Returns:
            JSON-serialisable facts for the manifest (e.g. nodes kept in fp32).
        """


#: ``validate(graph, onnx_path, gates) -> report``; raises ExportValidationError on failure.
Validator = Callable[[str, Path, str], dict]


def op_counts(path) -> dict[str, int]:
    """Node count per op type (``domain::op`` outside the default domain) of an ONNX file (or an
    ``onnx.ModelProto``), sorted by op type."""
    import onnx

    model = path if isinstance(path, onnx.ModelProto) else onnx.load(str(path), load_external_data=False)
    return dict(
        sorted(
            Counter(
                (f"{n.domain}::{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type) for n in model.graph.node
            ).items()
        )
    )


def variant_file(graph_file: str, variant: str) -> str:
    """``vision.onnx`` + ``ort-cpu`` -> ``vision.ort-cpu.onnx``."""
    stem = graph_file[:-5] if graph_file.endswith(".onnx") else graph_file
    return f"{stem}.{variant}.onnx"


@contextmanager
def _logged(name: str):
    """The default stage of :func:`run_transforms`: print the stage's message, nothing else."""
    note: dict = {}
    yield note
    logger.info(note.get("message", name))


def run_transforms(
    bundle_dir: str | Path, graphs: dict, transforms: Sequence[GraphTransform], validate: Validator, stage=None
) -> list[dict]:
    """Apply ``transforms`` in order to the graphs of a bundle being written, validating each.

    Args:
        bundle_dir: the (staging) bundle directory holding the exported graphs.
        graphs: the manifest's ``graphs`` section (``{name: {"file": ..., ...}}``); updated in
            place: a variant is added under ``graphs[name]["variants"][variant]``; each written
            file's external data files (export/external_data.py) under ``external_data``.
        transforms: applied in this order; a replacing transform's output is the next one's input.
        validate: checks one written file against PyTorch with the named gates (raises on failure).
        stage (callable): ``stage(name)``: a context manager around each (transform, graph) step that prints
            ``note["message"]`` as the step's line (export/stages.py ``StageClock.stage``: with its
            time and memory); default: the line alone.

    Returns:
        The manifest's ``transforms`` records, in order.

    Raises:
        ValueError: a transform names unknown gates or a graph the bundle does not have.
        ExportValidationError: (from ``validate``) a transformed graph fails its gates.
    """
    bundle_dir = Path(bundle_dir)
    stage = stage or _logged
    records = []
    for t in transforms:
        if t.gates not in GATES:
            raise ValueError(f"transform {t.name!r}: gates must be one of {GATES}, got {t.gates!r}")
        for g in t.graphs:
            if g not in graphs:
                raise ValueError(f"transform {t.name!r} applies to graph {g!r}, which the bundle does not have")
            with stage(f"{t.name} {g}") as note:
                rec = _apply(bundle_dir, graphs, t, g, validate)
                note["message"] = (
                    f"transform {t.name} on {g} -> {rec['file']}: {rec['nodes_before']} -> "
                    f"{rec['nodes_after']} nodes, validated ({t.gates} gates)"
                )
            records.append(rec)
    return records


def _apply(bundle_dir: Path, graphs: dict, t: GraphTransform, g: str, validate: Validator) -> dict:
    """One transform on one graph: write, count nodes, validate, record (see :func:`run_transforms`)."""
    from .external_data import data_files

    src_name = graphs[g]["file"]
    dst_name = src_name if t.variant is None else variant_file(src_name, t.variant)
    src, dst = bundle_dir / src_name, bundle_dir / dst_name
    before = op_counts(src)
    if t.variant is None:
        # Write beside the source first: a replacing transform must not clobber its own input.
        tmp = dst.with_name(dst.name + ".tmp.onnx")
        facts = t.apply(g, src, tmp) or {}
        tmp.replace(dst)
    else:
        # A new file: written under its final name, so external weights it writes
        # (``<dst>.data``, referenced by name from inside the graph) need no renaming.
        facts = t.apply(g, src, dst) or {}
    after = op_counts(dst)
    report = validate(g, dst, t.gates)
    files = data_files(dst)
    if t.variant is not None:
        entry = graphs[g].setdefault("variants", {})[t.variant] = {"file": dst_name, "transform": t.name}
    else:
        entry = graphs[g]
    entry.pop("external_data", None)
    if files:
        entry["external_data"] = files
    return {
        "transform": t.name,
        "graph": g,
        "settings": t.settings(),
        "variant": t.variant,
        "file": dst_name,
        "gates": t.gates,
        "nodes_before": sum(before.values()),
        "nodes_after": sum(after.values()),
        "op_counts_before": before,
        "op_counts_after": after,
        "facts": facts,
        "validation": report,
    }
