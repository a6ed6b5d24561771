"""ONNX Runtime backend (CPU execution provider here; CUDA EP when installed).

The provider is chosen explicitly: a requested provider that this onnxruntime build lacks is a
:class:`BackendUnavailableError`, never a quiet switch to CPU (ONNX Runtime itself would fall back
and only log a warning, so we check before creating the session and after).
"""

from __future__ import annotations

import numpy as np

from ...errors import BackendUnavailableError

#: Short names accepted on the command line -> ONNX Runtime provider names.
PROVIDERS = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider",
}


def resolve_provider(provider: str) -> str:
    """``"cpu"`` / ``"cuda"`` / a full provider name -> the provider name, checked available.

    Raises:
        BackendUnavailableError: unknown name, or not in ``onnxruntime.get_available_providers()``.
    """
    import onnxruntime as ort

    name = PROVIDERS.get(provider, provider)
    available = ort.get_available_providers()
    if name not in available:
        raise BackendUnavailableError(
            f"execution provider {provider!r} ({name}) is not available in this onnxruntime "
            f"{ort.__version__} build; available: {', '.join(available)}. Install the matching "
            "onnxruntime package (e.g. onnxruntime-gpu for CUDA) or choose --provider cpu."
        )
    return name


class OrtRunner:
    """One ``onnxruntime.InferenceSession``. ``run`` is thread-safe (ORT sessions are)."""

    backend = "onnxruntime"

    def __init__(self, path: str, name: str, provider: str = "cpu", intra_op_threads: int | None = None,
                 inter_op_threads: int | None = None):
        import onnxruntime as ort

        provider_name = resolve_provider(provider)
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if intra_op_threads:
            opts.intra_op_num_threads = int(intra_op_threads)
        if inter_op_threads:
            opts.inter_op_num_threads = int(inter_op_threads)
        self.session = ort.InferenceSession(str(path), sess_options=opts, providers=[provider_name])
        got = self.session.get_providers()[0]
        if got != provider_name:
            raise BackendUnavailableError(f"onnxruntime created {name} on {got}, not the requested {provider_name}")
        self.name = name
        self.provider = provider_name
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        outs = self.session.run(self.output_names, {k: feeds[k] for k in self.input_names})
        return dict(zip(self.output_names, outs))
