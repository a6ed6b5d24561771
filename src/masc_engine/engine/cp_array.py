"""The CP head (export/cp_head.py's graph) written once for any numpy-like array module.

With ``xp = numpy`` it runs on the CPU (tested against the numpy head and the ONNX graph in
tests/test_cp_head.py); with ``xp = cupy`` the same code runs on a CUDA GPU, so reference tokens
can stay cached on the device and only output tokens move. :class:`ArrayCPRunner` exposes it as a
:class:`~masc_engine.engine.backends.base.Runner` for the ``cp`` graph, so
:class:`masc_engine.runtime.cp_device.GraphCP` packs pairs for it exactly as for ONNX Runtime or
TensorRT.

``gemm_dtype="float16"`` emulates a reduced-precision engine: the cosine GEMM in fp16 (tensor
cores), norms, max and mean in fp32 (the TensorRT precision policy, engine/backends/trt_profiles.py).

CuPy path: unverified on a GPU by the session that wrote it (no GPU was available);
bench/gpu_check.py compares it with the numpy head on the lent GPU.
"""

from __future__ import annotations

import numpy as np

#: Cosine given to padding output patches before the max (the graph's ``INVALID_FILL``).
INVALID_FILL = -4.0
#: ``F.normalize``'s eps.
NORMALIZE_EPS = 1e-12


def cp_forward(xp, ref_tokens, ref_keep, out_tokens, out_valid, gemm_dtype: str = "float32") -> dict:
    """The ``cp`` graph: ``ref_tokens [R, N, D]``, ``ref_keep [R, N]``, ``out_tokens [R, K, M, D]``,
    ``out_valid [R, K, M]`` -> ``{"cp": [R, K], "best": [R, K, N], "n_keep": [R]}`` (float32)."""
    f32 = xp.float32
    ref_tokens = ref_tokens.astype(f32, copy=False)
    out_tokens = out_tokens.astype(f32, copy=False)
    r, n, d = ref_tokens.shape
    k, m = out_tokens.shape[1], out_tokens.shape[2]
    ref_n = ref_tokens / xp.maximum(xp.sqrt(xp.sum(ref_tokens * ref_tokens, axis=-1, keepdims=True)), f32(NORMALIZE_EPS))
    out_n = out_tokens / xp.maximum(xp.sqrt(xp.sum(out_tokens * out_tokens, axis=-1, keepdims=True)), f32(NORMALIZE_EPS))
    gd = np.dtype(gemm_dtype)  # numpy dtypes are accepted by CuPy too
    sims = xp.matmul(ref_n.astype(gd), out_n.reshape(r, k * m, d).astype(gd).transpose(0, 2, 1))  # [R, N, K*M]
    sims = sims.reshape(r, n, k, m)
    sims = xp.where(out_valid[:, None, :, :], sims, xp.asarray(INVALID_FILL, dtype=gd))
    best = sims.max(axis=-1).astype(f32).transpose(0, 2, 1)  # [R, K, N]
    keep = ref_keep.astype(f32)
    best = best * keep[:, None, :]
    n_keep = keep.sum(axis=-1)
    cp = best.sum(axis=-1) / xp.maximum(n_keep, f32(1.0))[:, None]
    return {"cp": cp, "best": xp.ascontiguousarray(best), "n_keep": n_keep}


class ArrayCPRunner:
    """The ``cp`` graph as a Runner over an array module (numpy, or CuPy on a GPU).

    ``run`` takes numpy arrays (or device arrays) and returns numpy arrays; ``run_device``
    returns the module's arrays (stays on the GPU with CuPy).
    """

    name = "cp"
    input_names = ["ref_tokens", "ref_keep", "out_tokens", "out_valid"]
    output_names = ["cp", "best", "n_keep"]

    def __init__(self, xp=np, gemm_dtype: str = "float32"):
        self.xp = xp
        self.backend = f"array:{xp.__name__}"
        self.gemm_dtype = gemm_dtype

    def run_device(self, feeds: dict, device=None) -> dict:
        xp = self.xp
        return cp_forward(xp, *(xp.asarray(feeds[k]) for k in self.input_names), gemm_dtype=self.gemm_dtype)

    def run(self, feeds: dict) -> dict:
        out = self.run_device(feeds)
        to_host = getattr(self.xp, "asnumpy", np.asarray)
        return {k: to_host(v) for k, v in out.items()}
