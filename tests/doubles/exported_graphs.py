"""masc-export's graph tracing replayed from an earlier export of the same checkpoint.

Tracing a graph with ``torch.export`` costs about 6 s per graph on the CI machine (four per SigLIP2
bundle, three per CLIPSeg one); tests whose subject is what masc-export does *around* the tracing
(the validation's refusal and its override, the precision transforms and their gates, the ONNX
checker, a bench script's dry run) need graphs of the checkpoint, not a fresh trace of them. The
graphs of a checkpoint do not depend on the export's other settings (patch budget, precision,
variants: those are the manifest's and the transforms' work), so the fp32 portable graphs of the
run's ``masc-export --model random:tiny-naflex`` (the fixture ``naflex_bundle``) are the graphs
another export of ``random:tiny-naflex`` traces, byte for byte (checked: two traced exports and
a replayed one write the same files), and those of ``seg_bundle`` the graphs of
``random:clipseg-tiny``.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path


def _copy_graph(bundle: Path, manifest: dict, graph: str, out: Path) -> dict:
    """Copy ``graph``'s portable file and the data files it points at from ``bundle`` into the
    folder ``out``; returns its manifest entry as the tracing stage returns it."""
    from masc_engine.export.external_data import data_files

    entry = {k: v for k, v in manifest["graphs"][graph].items() if k not in ("variants", "external_data")}
    for name in [entry["file"], *data_files(bundle / entry["file"])]:
        shutil.copyfile(bundle / name, out / name)
    return entry


def _same_checkpoint(bundle: Path, manifest: dict, source, architecture=None) -> None:
    opened = json.loads(json.dumps([source, architecture if architecture is not None else manifest["architecture"]]))
    assert opened == [manifest["source"], manifest["architecture"]], (
        f"the export opened {source}, not the checkpoint of {bundle}"
    )


@contextlib.contextmanager
def graphs_from(bundle: Path, only: tuple[str, ...] | None = None):
    """While the block runs, every graph masc-export traces is copied from ``bundle`` instead (its
    portable ``.onnx`` file and the external data files it points at); everything else runs as
    usual: the checkpoint is opened and the PyTorch (transformers) references computed, then the
    validation, transforms, gates, ONNX checker and manifest run on the copied graphs.

    A SigLIP2 bundle replays the ``export <graph>`` stages of the PyTorch worker
    (export/torch_worker.py ``TorchWorker``); a segmenter bundle (manifest ``kind: segmenter``)
    replays export/graphs.py ``export_graph`` of export/segmenter.py, each graph's manifest entry
    checked against the copied one's. The opened checkpoint must be ``bundle``'s own (its
    manifest's ``source`` and ``architecture``): an export of another checkpoint fails here instead
    of validating another model's graphs. ``bundle`` must be an fp32 export (its portable graphs
    are the traced ones).

    ``only`` (SigLIP2 bundles): the graphs copied; the others are traced as usual. The opened
    checkpoint may then be another one of the same architecture (a test's copy of ``bundle``'s
    checkpoint with weights of the traced graphs edited): the export's own fp32 validation of each
    copied graph against the opened checkpoint's PyTorch outputs is the check that its weights
    are ``bundle``'s.
    """
    from masc_engine.export import graphs as export_graphs
    from masc_engine.export import segmenter, torch_worker

    manifest = json.loads((bundle / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["precision"]["mode"] == "fp32", f"{bundle} does not hold the traced fp32 graphs"
    real_run, real_export, real_load = (
        torch_worker.TorchWorker.run,
        export_graphs.export_graph,
        segmenter.load_segmenter,
    )

    def run(self, stage, describe, task, *args):
        if task == "open_checkpoint":
            info = real_run(self, stage, describe, task, *args)
            source = manifest["source"] if only else info["source"]  # only: the validation checks
            _same_checkpoint(bundle, manifest, source, info["architecture"])
            return info
        if task != "export" or (only is not None and args[0] not in only):
            return real_run(self, stage, describe, task, *args)
        entry = _copy_graph(bundle, manifest, args[0], Path(args[1]))
        self.clock.record(stage, 0.0, 0, 0, describe(entry), where=" (copied)")
        return entry

    def load_segmenter(model, revision=None):
        m, processor, source = real_load(model, revision)
        _same_checkpoint(bundle, manifest, source, segmenter.architecture(m))
        return m, processor, source

    def export_graph(spec, path, opset=18):
        entry = _copy_graph(bundle, manifest, spec.name, Path(path).parent)
        assert json.loads(json.dumps(spec.manifest_entry())) == entry, f"{spec.name}: not {bundle}'s graph"
        assert Path(path).name == entry["file"], (path, entry["file"])

    if manifest.get("kind") == "segmenter":
        assert only is None, "a segmenter bundle replays every graph"
        export_graphs.export_graph, segmenter.load_segmenter = export_graph, load_segmenter
    else:
        torch_worker.TorchWorker.run = run
    try:
        yield
    finally:
        torch_worker.TorchWorker.run = real_run
        export_graphs.export_graph, segmenter.load_segmenter = real_export, real_load
