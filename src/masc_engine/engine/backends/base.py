"""One backend interface: a loader makes a runner; a runner runs one graph.

Polygraphy-style separation: loading (file, provider, threads) is distinct from running
(feeds in, outputs out), so the scoring code never knows which backend it talks to.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import numpy as np


class BundleView(Protocol):
    """What a backend's ``load_runner`` reads of an engine/bundle.py ``Bundle`` (not imported by
    the backends: bundle.py reaches them)."""

    path: Path
    manifest: dict[str, Any]
    #: Whether a backend may keep compiled graphs of this bundle across processes (OpenVINO's cache).
    compiled_model_cache: bool

    @property
    def graph_precision(self) -> str:
        """The precision the ONNX graphs hold."""
        ...

    def graph(self, name: str) -> dict[str, Any]:
        """The manifest's entry for graph ``name``."""
        ...

    def graph_file(self, graph: str, variant: str = ...) -> Path:
        """Path of ``graph``'s ONNX file (of ``variant``), its sha256 checked."""
        ...


class Runner(Protocol):
    """Runs one graph. Implementations must be safe to call from several threads at once.

    Every runner also has ``run_device(feeds, device) -> outputs``: inputs as arrays of a token
    device (engine/device.py) or host numpy arrays, outputs as arrays of that device, so tokens
    stay on the GPU between graphs (``OrtRunner`` through IO binding, ``TrtRunner`` by engine
    tensor addresses); ``run`` always takes and returns numpy arrays.
    """

    name: str
    backend: str
    #: What the graph computes in: ``fp32``, ``fp16``, ``bf16`` or ``int8-dynamic`` (masc-run's
    #: caches and resume fingerprint are keyed by it through the scorer's config).
    precision: str
    input_names: list[str]
    output_names: list[str]

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the graph. ``feeds`` maps every input name to an array of the graph's dtype."""
        ...

    # feeds and outputs: arrays of ``device``, an engine/device.py ArrayDevice (not imported here:
    # device.py reaches the backend registry, which names this protocol).
    def run_device(self, feeds: dict[str, Any], device: Any) -> dict[str, Any]:
        """Run the graph on ``device`` memory; returns device arrays."""
        ...


#: The backends themselves are listed, with their providers and options, in the backend registry
#: (backends/registry.py ``BACKENDS``).
