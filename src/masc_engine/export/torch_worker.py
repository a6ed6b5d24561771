"""The export's PyTorch stages, in a worker process that ends before ONNX Runtime loads the weights.

Everything that needs PyTorch runs here, one graph at a time: open the checkpoint (its
safetensors are memory-mapped, so a tower's weights become resident only when read), compute
every PyTorch output the validation will compare against (export/validate.py and
export/fusion.py ``*_references``: small arrays, sent back to the exporter), and export each graph
(export/graphs.py). The exporter then closes the worker; ONNX Runtime sessions and graph
transforms run in the exporter's own process, with no PyTorch weights resident.

Why a process and not ``del model``: the weights stay resident while any tensor of them lives,
and torch's ONNX exporter keeps one alive (onnxscript 0.7's rewrite rules hold the last graph
they matched, with its initializers); a process also takes its heap fragmentation with it. When
the worker ends, all of it goes back to the OS.

Each call (:func:`call`) returns its result with the wall time and the worker's peak and current
RSS during the call, which the exporter prints as the stage's line (export/stages.py).
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from typing import Any, Callable
import time
from pathlib import Path

from ..errors import ExportValidationError, MascEngineError

#: The worker's open checkpoint (model, processor, settings), kept between calls.
_STATE: dict = {}


class ExportWorkerError(MascEngineError):
    """The PyTorch worker process ended during a stage (killed by the system, e.g. out of memory)."""


def _tower_bytes(module) -> int:
    return int(sum(p.numel() * p.element_size() for p in module.parameters()))


def open_checkpoint(model: str, revision: str | None, max_num_patches: int | None, out: str) -> dict:
    """Load the checkpoint (lazily: safetensors are memory-mapped) and its processor, write the
    bundle's ``tokenizer.json`` into ``out``, and return what the exporter plans with: ``source``,
    ``image`` and ``text`` settings, ``architecture``, ``towers`` (``{graph: (heads, width)}`` of
    the encoders) and ``tower_bytes`` (fp32 weight bytes of each exported graph).

    Raises:
        CheckpointError: not loadable, not SigLIP2, or no attention-pooling head.
    """
    import torch
    import transformers

    from .checkpoint import (
        CheckpointError,
        image_settings_from_processor,
        load_checkpoint,
        save_tokenizer,
        text_settings_from_processor,
    )

    torch.set_grad_enabled(False)
    m, processor, source = load_checkpoint(model, revision)
    vm, tm = m.vision_model, m.text_model
    if not getattr(vm, "use_head", True) or not hasattr(vm, "head"):
        raise CheckpointError("this checkpoint's vision tower has no attention-pooling head; PF needs it")
    image = image_settings_from_processor(m, processor, max_num_patches)
    text = text_settings_from_processor(m, processor)
    save_tokenizer(processor, Path(out) / "tokenizer.json")
    _STATE.update(model=m, processor=processor, image=image, text=text)
    v, t = vm.config, tm.config
    head = _tower_bytes(vm.head)
    return {
        "source": source,
        "image": image,
        "text": text,
        "architecture": {
            "model_type": m.config.model_type,
            "vision_width": int(v.hidden_size),
            "text_projection": int(tm.head.out_features),
            "vision_layers": int(v.num_hidden_layers),
            "pool_heads": int(vm.head.attention.num_heads),
        },
        "towers": {
            "vision": (int(v.num_attention_heads), int(v.hidden_size)),
            "text": (int(t.num_attention_heads), int(t.hidden_size)),
        },
        "tower_bytes": {"vision": _tower_bytes(vm) - head, "pool": head, "text": _tower_bytes(tm)},
        "vocab_size": int(m.config.text_config.vocab_size),
        "versions": {"torch": str(torch.__version__), "transformers": str(transformers.__version__)},
    }


def vision_references() -> dict:
    """PyTorch outputs of the vision, pool and score checks (export/validate.py, export/fusion.py)."""
    from . import fusion, validate

    m, processor, image = _STATE["model"], _STATE["processor"], _STATE["image"]
    vm = m.vision_model
    return {
        "vision": validate.vision_references(vm, processor, image),
        "pool": validate.pool_references(vm.head, int(vm.config.hidden_size)),
        "scores_vision": fusion.score_references_vision(vm, processor, image),
        "width": int(vm.config.hidden_size),
    }


def text_references(bundle_dir: str) -> dict:
    """PyTorch outputs of the text and score checks; the token ids of the bundle's tokenizer are
    checked against the reference processor's first (ExportValidationError)."""
    from . import fusion, validate

    m, processor, text = _STATE["model"], _STATE["processor"], _STATE["text"]
    ids = validate.text_token_ids(processor, text, Path(bundle_dir))
    return {
        "text": validate.text_references(m.text_model, ids),
        "scores_text": fusion.score_references_text(m.text_model, fusion.score_prompt_ids(text, Path(bundle_dir))),
    }


def export(graph: str, out: str, opset: int) -> dict:
    """Export one graph of the open checkpoint into the folder ``out``; returns its manifest entry."""
    from . import cp_head, graphs

    m, image, text = _STATE["model"], _STATE["image"], _STATE["text"]
    vm = m.vision_model
    if graph == "vision" and image["mode"] == "naflex":
        spec = graphs.vision_spec_naflex(vm, image["patch_size"], image["position_grid"], trace_patches=64)
    elif graph == "vision":
        spec = graphs.vision_spec_fixed(vm, image["image_size"][0])
    elif graph == "pool":
        spec = graphs.pool_spec(vm.head, int(vm.config.hidden_size), trace_tokens=48)
    elif graph == "text":
        spec = graphs.text_spec(m.text_model, text["max_length"], int(m.config.text_config.vocab_size))
    elif graph == "cp":
        spec = cp_head.cp_spec(int(vm.config.hidden_size))
    else:
        raise ValueError(f"no graph {graph!r}")
    graphs.export_graph(spec, Path(out) / spec.file, opset=opset)
    return spec.manifest_entry()


_TASKS: dict[str, Callable[..., Any]] = {
    "open_checkpoint": open_checkpoint,
    "vision_references": vision_references,
    "text_references": text_references,
    "export": export,
}


def call(task: str, *args) -> dict:
    """Run ``task`` in the worker: ``{"result", "seconds", "peak", "rss", "lifetime_peak"}`` (bytes:
    the call's sampled peak RSS, export/stages.py ``PeakSampler``; the RSS after it; the worker's
    ``VmHWM``). An ExportValidationError comes back as ``{"error": (message, report)}`` (its report
    would not survive pickling)."""
    from .stages import peak_sampler, release_memory, rss

    release_memory()
    sampler = peak_sampler()
    sampler.mark()
    t0 = time.time()
    try:
        result = _TASKS[task](*args)
    except ExportValidationError as e:
        return {"error": (str(e), e.report)}
    release_memory()
    cur, hwm = rss()
    return {"result": result, "seconds": time.time() - t0, "peak": sampler.mark(), "rss": cur, "lifetime_peak": hwm}


def _one_line_error(stage: str, e: BaseException) -> BaseException:
    """What the exporter raises for a task's exception: the package's own errors as they are
    (their messages are one line), a library's (transformers' ``ValueError`` on a bad config, ...)
    as one line naming the stage: a :class:`~.checkpoint.CheckpointError` while the checkpoint is
    opened, else an :class:`ExportWorkerError`."""
    if isinstance(e, MascEngineError):
        return e
    from .checkpoint import CheckpointError

    text = " ".join(str(e).split())
    text = (text[:400] + "...") if len(text) > 400 else text
    what = f"{type(e).__name__}: {text}" if text else type(e).__name__
    if stage == "checkpoint":
        return CheckpointError(f"the checkpoint cannot be opened ({what})")
    return ExportWorkerError(f"the PyTorch export worker failed in the {stage} stage ({what})")


class TorchWorker:
    """The exporter's handle on the worker: ``python -m masc_engine.export.torch_worker`` in a
    subprocess, calls sent one at a time over two pipes (pickled), each printed as a stage line by
    ``clock`` (export/stages.py :class:`~.stages.StageClock`). The process ends when the ``with``
    block does (or :meth:`close`).

    A plain subprocess rather than ``multiprocessing``: its ``spawn`` start method re-imports the
    caller's ``__main__`` in the child, which re-runs a script that calls :func:`export_bundle` at
    top level (or fails for ``python -``/stdin); the worker only ever imports masc_engine.
    """

    def __init__(self, clock):
        import masc_engine

        self.clock = clock
        self.lifetime_peak = 0  # the worker's VmHWM, bytes
        env = dict(os.environ)
        root = str(Path(masc_engine.__file__).resolve().parents[1])  # the same masc_engine in the worker
        env["PYTHONPATH"] = os.pathsep.join([root] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        cmd_r, cmd_w = os.pipe()
        res_r, res_w = os.pipe()
        self._proc = subprocess.Popen(
            [sys.executable, "-m", __name__, str(cmd_r), str(res_w)],
            env=env,
            stdin=subprocess.DEVNULL,
            pass_fds=(cmd_r, res_w),
        )
        os.close(cmd_r)
        os.close(res_w)
        self._cmd, self._res = os.fdopen(cmd_w, "wb"), os.fdopen(res_r, "rb")

    def run(self, stage: str, describe, task: str, *args):
        """Run ``task`` as the stage ``stage``; ``describe(result)`` is the line's text.

        Raises:
            ExportWorkerError: the worker process ended during the stage, or a task failed with
                an exception of a library (one line naming it; the worker's traceback is the
                exception's ``__cause__``, which masc-export writes to the export log).
            CheckpointError: the checkpoint stage failed (any exception while opening it).
            (and the package's own errors a task raises: ExportValidationError, ...)
        """
        try:
            pickle.dump((task, args), self._cmd)
            self._cmd.flush()
            out = pickle.load(self._res)
        except (EOFError, BrokenPipeError, pickle.UnpicklingError):
            code = self._proc.wait()
            raise ExportWorkerError(
                f"the PyTorch export worker ended during the {stage} stage (exit status {code}; "
                "killed by the system, e.g. out of memory? see --max-memory-gb)"
            ) from None
        if "exception" in out:
            raise _one_line_error(stage, out["exception"]) from RuntimeError(
                "in the PyTorch export worker:\n" + out["traceback"]
            )
        if "error" in out:
            raise ExportValidationError(*out["error"])
        self.clock.record(
            stage, out["seconds"], out["peak"], out["rss"], describe(out["result"]), where=" (torch worker)"
        )
        self.lifetime_peak = max(self.lifetime_peak, out["lifetime_peak"])
        return out["result"]

    def close(self) -> None:
        """End the worker (it exits when its command pipe closes) and wait for it."""
        for f in (self._cmd, self._res):
            try:
                f.close()
            except OSError:
                pass
        try:
            self._proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


#: Modules the worker's tasks import (measured with torch 2.13, transformers 5.24, onnxscript 0.7:
#: the checkpoint's load pulls in scipy through transformers; torch's ONNX exporter pulls in
#: torch.export, the inductor's decompositions, sympy and networkx). A module missing here is only
#: imported later and walked by each collection; one that no longer exists is skipped.
WORKER_IMPORTS = (
    "torch",
    "transformers",
    "transformers.generation",
    "scipy.optimize",
    "scipy.sparse",
    "scipy.spatial",
    "torch.distributed",
    "torch.onnx",
    "torch.onnx._internal.exporter._core",
    "torch.export",
    "torch._dynamo",
    "torch._inductor.decomposition",
    "onnxscript",
    "onnxscript.rewriter",
    "sympy",
    "networkx",
)


def _freeze_library_objects() -> None:
    """Import the libraries the tasks use (:data:`WORKER_IMPORTS`), then move every object alive
    to the garbage collector's permanent generation (``gc.freeze``).

    Why: each call collects garbage before and after its task (export/stages.py
    ``release_memory``, so that a stage's peak is its own) and a full collection walks every
    tracked object: about 530,000 once the first graph is exported, 0.15-0.27 s a collection,
    about 3 s of a tiny model's 24 s export. The objects the imports create live as long as the
    worker; frozen, they are no longer walked. Everything created later (the checkpoint, the
    exported programs) is collected as before.
    """
    import gc
    import importlib

    for name in WORKER_IMPORTS:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    gc.collect()
    gc.freeze()


def serve(cmd_fd: int, res_fd: int) -> None:
    """The worker's loop: read ``(task, args)``, answer :func:`call`'s result, until the exporter
    closes the command pipe. An exception goes back pickled with its traceback text."""
    import traceback

    _freeze_library_objects()
    with os.fdopen(cmd_fd, "rb") as cmd, os.fdopen(res_fd, "wb") as res:
        while True:
            try:
                task, args = pickle.load(cmd)
            except EOFError:
                return
            try:
                out = call(task, *args)
            except Exception as e:  # noqa: BLE001 (sent to the exporter, which raises it)
                out = {"exception": e, "traceback": traceback.format_exc()}
                try:
                    pickle.dumps(e)
                except Exception:  # noqa: BLE001
                    out["exception"] = RuntimeError(f"{type(e).__name__}: {e}")
            pickle.dump(out, res)
            res.flush()


if __name__ == "__main__":
    serve(int(sys.argv[1]), int(sys.argv[2]))
