"""A bundle: a directory of ONNX graphs, tokenizer files and ``manifest.json``.

Loading checks the format and (by default) every file's sha256, then hands out runners for its
graphs on an explicitly chosen backend and provider.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from ..errors import BackendUnavailableError, BundleError
from .backends.base import BACKENDS, Runner
from .manifest import fingerprint, read_manifest, verify_files


class RandomWeightsWarning(UserWarning):
    """Scores from a random-weight test bundle measure nothing; they only test the pipeline."""


class Bundle:
    """An exported bundle, loaded read-only.

    Attributes:
        path: the bundle directory.
        manifest: the parsed ``manifest.json``.
        fingerprint: 16 hex chars identifying the bundle's content and settings.
    """

    def __init__(self, path: str | Path, verify: bool = True):
        self.path = Path(path)
        self.manifest = read_manifest(self.path)
        if verify:
            verify_files(self.path, self.manifest)
        self.fingerprint = fingerprint(self.manifest)
        if self.random_weights:
            warnings.warn(
                f"bundle {self.path} was exported from random weights "
                f"({self.manifest['source']['model']}): its scores only test the pipeline",
                RandomWeightsWarning, stacklevel=2,
            )

    @property
    def random_weights(self) -> bool:
        return bool(self.manifest["source"].get("random_weights"))

    @property
    def precision(self) -> str:
        """The graphs' precision: ``fp32``, ``fp16`` or ``bf16`` (mixed-precision graphs from
        ``masc-export --precision``), or ``int8-dynamic``; bundles written before it was recorded
        are fp32."""
        return str(self.manifest.get("precision", {}).get("mode", "fp32"))

    def file(self, name: str) -> Path:
        return self.path / name

    def graph(self, name: str) -> dict:
        try:
            return self.manifest["graphs"][name]
        except KeyError:
            raise BundleError(f"bundle {self.path} has no {name!r} graph") from None

    def runner(self, graph: str, backend: str = "onnxruntime", provider: str = "cpu",
               intra_op_threads: int | None = None, precision: str | None = None,
               ort_memory: str = "lean") -> Runner:
        """A runner for one of the bundle's graphs (``vision``, ``pool``, ``text``, ``cp``).

        Args:
            backend: ``onnxruntime`` (the ONNX graphs; ``provider`` ``cpu`` or ``cuda``) or
                ``tensorrt`` (the engine set ``tensorrt-<precision>/`` built by
                ``masc-export --backend tensorrt``; ``provider`` must be ``cuda``).
            precision: TensorRT: ``fp32``, ``fp16`` or ``bf16`` (default: the only engine set
                present). ONNX Runtime: ``None`` or the bundle's own precision (:attr:`precision`;
                the graphs carry it, their inputs and outputs stay float32).
            ort_memory: ONNX Runtime CPU memory settings, ``lean`` or ``arena``
                (engine/backends/onnxruntime.py ``ORT_MEMORY``).

        Raises:
            BackendUnavailableError: unknown backend, the provider or TensorRT is missing (never a
                quiet fallback to CPU).
            EngineCompatibilityError: TensorRT engines built for another GPU / TensorRT version.
            BundleError: the bundle has no such graph (or no such engine set).
        """
        entry = self.graph(graph)
        if backend == "onnxruntime":
            from .backends.onnxruntime import OrtRunner

            own = self.precision
            if precision not in (None, own):
                raise BackendUnavailableError(
                    f"bundle {self.path} holds {own} graphs; for precision {precision!r} export a bundle with "
                    f"masc-export --precision {precision} (the precision is in the graphs)")
            if own == "bf16" and provider in ("cpu", "CPUExecutionProvider"):
                # ONNX Runtime's CPU provider has no bf16 MatMul/Add/Mul/Tanh kernels (onnxruntime 1.32).
                raise BackendUnavailableError(
                    f"bundle {self.path} holds bf16 graphs, which ONNX Runtime's CPU provider cannot run (no bf16 "
                    "kernels); use --provider cuda or --backend tensorrt on a GPU, or an fp16/fp32 bundle on CPU")
            runner = OrtRunner(self.file(entry["file"]), graph, provider=provider,
                               intra_op_threads=intra_op_threads, ort_memory=ort_memory)
            runner.precision = own
            return runner
        if backend == "tensorrt":
            from .backends.tensorrt import load_runner  # lazy: tensorrt is optional

            return load_runner(self, graph, precision=precision, provider=provider)
        raise BackendUnavailableError(f"unknown backend {backend!r}; available: {', '.join(BACKENDS)}")
