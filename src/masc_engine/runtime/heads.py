"""The MaSC scoring heads (float32), written once for any numpy-like array module.

Ported from masc-metric 0.3.0 ``masc/metric.py``:

- CP, ``masked_maxcos`` (``MaSC._concept_preservation``): L2-normalise reference and output patch
  tokens, cosine matrix ``[N_ref, N_out]``, max over *all* valid output patches, mean over the
  reference patches whose mask weight is ``> fg_threshold``. Paper Sec. 3 (CP).
- PF (``MaSC._prompt_following``): cosine between the background-pooled image embedding (pooling
  head with foreground patches, weight ``>= fg_threshold``, hidden) and the prompt's pooled text
  embedding. Paper Sec. 3 (PF).

Every function takes the array module as ``xp`` (``numpy`` by default; ``cupy`` runs the same code
on a CUDA GPU, so tokens can stay in device memory). :func:`cp_forward` is the same CP for many
pairs at once in the layout of the bundle's ``cp`` graph (export/cp_head.py, the torch head that
graph is traced from, is the only other implementation; it imports its constants from here).

On numpy the cosine products run on one BLAS thread (runtime/blas.py), so a score's bits do not
depend on the process's BLAS thread count. The CuPy path is unverified on a GPU
(bench/gpu_check.py ``cp_head_cupy`` compares it with numpy when run on one).
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

import numpy as np

from .blas import single_thread_blas
from .masks import DEFAULT_FG_THRESHOLD, cp_keep, foreground

#: An array of numpy or of CuPy (``xp``, the array module: CuPy ships no types).
Array = Any

#: ``torch.nn.functional.normalize``'s default eps: x / max(||x||, eps).
NORMALIZE_EPS = 1e-12
#: Cosine given to padding output patches before the max in :func:`cp_forward` and the ``cp``
#: graph: below every real cosine (>= -1) and exactly representable in fp16 and bf16.
INVALID_FILL = -4.0


def _product(xp: Any) -> AbstractContextManager[object]:
    """The context a cosine product runs in: one BLAS thread on numpy, nothing on a GPU module."""
    return single_thread_blas() if xp is np else nullcontext()


def l2_normalize(x: Array, axis: int = -1, xp: Any = np) -> Array:
    """``[..., D]`` -> float32 unit vectors along ``axis``, as ``F.normalize`` (``x / max(||x||, eps)``)."""
    x = xp.asarray(x, dtype=xp.float32)
    n = xp.sqrt(xp.sum(x * x, axis=axis, keepdims=True, dtype=xp.float32))
    return x / xp.maximum(n, xp.float32(NORMALIZE_EPS))


def cosine_matrix(a: Array, b: Array, xp: Any = np) -> Array:
    """``[N, D]``, ``[M, D]`` -> ``[N, M] float32`` cosines (rows L2-normalised as ``F.normalize``).

    On numpy the product runs on one BLAS thread (runtime/blas.py), so its bits do not depend on
    the process's BLAS thread count (a Ray worker's ``OMP_NUM_THREADS=1`` included).
    """
    an, bn = l2_normalize(a, xp=xp), l2_normalize(b, xp=xp)
    with _product(xp):
        return an @ bn.T


def best_match_cosines(ref_tokens: Array, out_tokens: Array, xp: Any = np) -> Array:
    """For each reference patch, the max cosine to any output patch.

    Args:
        ref_tokens: ``[N, D] float32`` reference patch tokens (valid patches only).
        out_tokens: ``[M, D] float32`` output patch tokens (valid patches only), ``M >= 1``.
        xp: the array module of the tokens (numpy or CuPy).

    Returns:
        ``[N] float32`` in ``[-1, 1]``.
    """
    return cosine_matrix(ref_tokens, out_tokens, xp).max(axis=1)  # [N, M] -> [N]


def masked_maxcos(
    ref_tokens: Array, out_tokens: Array, ref_weights: Array, fg_threshold: float = DEFAULT_FG_THRESHOLD, xp: Any = np
) -> tuple[float, dict[str, Any]]:
    """CP: mean over reference foreground patches of their best cosine to any output patch.

    Args:
        ref_tokens: ``[N, D] float32`` reference patch tokens.
        out_tokens: ``[M, D] float32`` output patch tokens.
        ref_weights: ``[N] float32`` reference mask on the patch grid, in ``[0, 1]``.
        fg_threshold: a reference patch counts as foreground when its weight is ``> fg_threshold``
            (runtime/masks.py ``cp_keep``).
        xp: the array module of the tokens and weights (numpy or CuPy).

    Returns:
        ``(cp, extras)``: cp in ``[-1, 1]``, NaN when no reference patch is foreground (the
        reference's behaviour); extras ``cp_n_ref_fg``, ``cp_n_ref_total``, ``cp_fg_frac_ref``
        (mean mask weight), as masc-metric 0.3.0.
    """
    keep = cp_keep(ref_weights, fg_threshold)
    extras = {
        "cp_n_ref_fg": int(keep.sum()),
        "cp_n_ref_total": int(ref_tokens.shape[0]),
        "cp_fg_frac_ref": float(xp.mean(ref_weights, dtype=xp.float32)),
    }
    if not keep.any():
        return float("nan"), extras
    best = best_match_cosines(ref_tokens[keep], out_tokens, xp)
    return float(xp.mean(best, dtype=xp.float32)), extras


def cp_forward(
    ref_tokens: Array, ref_keep: Array, out_tokens: Array, out_valid: Array, xp: Any = np, gemm_dtype: str = "float32"
) -> dict[str, Array]:
    """CP for packed pairs, in the layout and arithmetic of the bundle's ``cp`` graph.

    The same normalisation and cosine as :func:`masked_maxcos`; padding output patches get
    :data:`INVALID_FILL` before the max, and the mean is the graph's ``sum / max(n_keep, 1)``
    (another summation order than numpy's pairwise mean: equal within ``tolerances.CP_HEAD_ATOL``).

    Args:
        ref_tokens: ``[R, N, D] float32`` references (padding rows anything).
        ref_keep: ``[R, N] bool`` kept reference patches (runtime/masks.py ``cp_keep``).
        out_tokens: ``[R, K, M, D] float32`` K outputs per reference (padding rows anything).
        out_valid: ``[R, K, M] bool`` real output patches.
        xp: the array module of the arrays (numpy or CuPy).
        gemm_dtype: ``"float16"`` emulates a reduced-precision engine: the cosine product in fp16,
            norms, max and mean in fp32 (the TensorRT precision policy,
            engine/backends/trt_profiles.py).

    Returns:
        ``{"cp": [R, K], "best": [R, K, N] (0 on unkept patches), "n_keep": [R]}`` float32 arrays
        of ``xp``; ``cp`` is 0 (not NaN) for a reference keeping no patch, as the graph's.
    """
    r, n, d = ref_tokens.shape
    k, m = out_tokens.shape[1], out_tokens.shape[2]
    ref_keep, out_valid = xp.asarray(ref_keep), xp.asarray(out_valid)  # host masks onto the device
    gd = np.dtype(gemm_dtype)  # numpy dtypes are accepted by CuPy too
    ref_n = l2_normalize(ref_tokens, xp=xp).astype(gd)
    out_n = l2_normalize(out_tokens, xp=xp).reshape(r, k * m, d).astype(gd)
    with _product(xp):
        sims = xp.matmul(ref_n, out_n.transpose(0, 2, 1)).reshape(r, n, k, m)  # [R, N, K, M]
    sims = xp.where(out_valid[:, None, :, :], sims, xp.asarray(INVALID_FILL, dtype=gd))
    keep = ref_keep.astype(xp.float32)
    best = sims.max(axis=-1).astype(xp.float32).transpose(0, 2, 1) * keep[:, None, :]  # [R, K, N]
    n_keep = keep.sum(axis=-1)
    cp = best.sum(axis=-1) / xp.maximum(n_keep, xp.float32(1.0))[:, None]
    return {"cp": cp, "best": xp.ascontiguousarray(best), "n_keep": n_keep}


def background_key_padding_mask(out_weights: Array, fg_threshold: float = DEFAULT_FG_THRESHOLD) -> Array:
    """PF's key_padding_mask over the output's valid patches: True (hidden) where the weight is
    ``>= fg_threshold`` (runtime/masks.py ``foreground``)."""
    return foreground(out_weights, fg_threshold)


def cosine(a: Array, b: Array, xp: Any = np) -> float:
    """Cosine of two ``[D]`` vectors, normalised as ``F.normalize`` does."""
    return float(xp.sum(l2_normalize(a, xp=xp) * l2_normalize(b, xp=xp), dtype=xp.float32))
