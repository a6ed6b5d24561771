"""One backend interface: a loader makes a runner; a runner runs one graph.

Polygraphy-style separation: loading (file, provider, threads) is distinct from running
(feeds in, outputs out), so the scoring code never knows which backend it talks to.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np


class Runner(Protocol):
    """Runs one graph. Implementations must be safe to call from several threads at once.

    Device runners (``TrtRunner``, ``ArrayCPRunner`` over CuPy) also have
    ``run_device(feeds) -> outputs`` taking and returning device arrays, so tokens can stay on
    the GPU between graphs; ``run`` always takes and returns numpy arrays.
    """

    name: str
    backend: str
    input_names: list[str]
    output_names: list[str]

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the graph. ``feeds`` maps every input name to an array of the graph's dtype."""
        ...


#: ``onnxruntime``: ONNX Runtime on the bundle's ONNX graphs (CPU or CUDA execution provider).
#: ``tensorrt``: serialized TensorRT engines built from them (backends/tensorrt.py, imported
#: lazily; unverified: no TensorRT/GPU was available to the session that wrote it).
BACKENDS = ("onnxruntime", "tensorrt")
