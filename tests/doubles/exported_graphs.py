"""masc-export's graph tracing replayed from an earlier export of the same checkpoint.

Tracing a graph with ``torch.export`` costs about 6 s per graph on the CI machine (four per SigLIP2
bundle); tests whose subject is what masc-export does *around* the tracing (the validation's
refusal and its override, the precision transforms and their gates, the ONNX checker, a bench
script's dry run) need graphs of the checkpoint, not a fresh trace of them. The graphs of a
checkpoint do not depend on the export's other settings (patch budget, precision, variants: those
are the manifest's and the transforms' work), so the fp32 portable graphs of the run's one
``masc-export --model random:tiny-naflex`` (the fixture ``naflex_bundle``) are the graphs
another export of ``random:tiny-naflex`` traces.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path


@contextlib.contextmanager
def graphs_from(bundle: Path):
    """While the block runs, every ``export <graph>`` stage of masc-export copies that graph from
    ``bundle`` (its portable ``.onnx`` file and the external data file it points at) instead of
    tracing it in the PyTorch worker; every other stage runs as usual: the worker opens the
    checkpoint and computes the PyTorch references, then the validation, transforms, gates, ONNX
    checker and manifest run on the copied graphs.

    The opened checkpoint must be ``bundle``'s own (its manifest's ``source`` and
    ``architecture``): an export of another checkpoint fails here instead of validating another
    model's graphs. ``bundle`` must be an fp32 export (its portable graphs are the traced ones).
    """
    from masc_engine.export import torch_worker

    manifest = json.loads((bundle / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["precision"]["mode"] == "fp32", f"{bundle} does not hold the traced fp32 graphs"
    real = torch_worker.TorchWorker.run

    def run(self, stage, describe, task, *args):
        if task == "open_checkpoint":
            info = real(self, stage, describe, task, *args)
            opened = json.loads(json.dumps([info["source"], info["architecture"]]))
            assert opened == [manifest["source"], manifest["architecture"]], (
                f"the export opened {info['source']}, not the checkpoint of {bundle}"
            )
            return info
        if task != "export":
            return real(self, stage, describe, task, *args)
        graph, out = args[0], Path(args[1])
        entry = {k: v for k, v in manifest["graphs"][graph].items() if k not in ("variants", "external_data")}
        for name in [entry["file"], *manifest["graphs"][graph].get("external_data", [])]:
            shutil.copyfile(bundle / name, out / name)
        self.clock.record(stage, 0.0, 0, 0, describe(entry), where=" (copied)")
        return entry

    torch_worker.TorchWorker.run = run
    try:
        yield
    finally:
        torch_worker.TorchWorker.run = real
