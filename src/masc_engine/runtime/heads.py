"""The MaSC scoring heads in pure numpy (float32).

Ported from masc-metric 0.3.0 ``masc/metric.py``:

- CP, ``masked_maxcos`` (``MaSC._concept_preservation``): L2-normalise reference and output patch
  tokens, cosine matrix ``[N_ref, N_out]``, max over *all* valid output patches, mean over the
  reference patches whose mask weight is ``> fg_threshold``. Paper Sec. 3 (CP).
- PF (``MaSC._prompt_following``): cosine between the background-pooled image embedding (pooling
  head with foreground patches, weight ``>= fg_threshold``, hidden) and the prompt's pooled text
  embedding. Paper Sec. 3 (PF).
"""

from __future__ import annotations

import numpy as np

from .blas import single_thread_blas

#: ``torch.nn.functional.normalize``'s default eps: x / max(||x||, eps).
NORMALIZE_EPS = 1e-12


def l2_normalize(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """``[..., D] float32`` -> unit vectors along ``axis`` (as ``F.normalize``)."""
    x = np.asarray(x, dtype=np.float32)
    n = np.sqrt(np.sum(x * x, axis=axis, keepdims=True, dtype=np.float32))
    return x / np.maximum(n, np.float32(NORMALIZE_EPS))


def cosine_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``[N, D]``, ``[M, D]`` -> ``[N, M] float32`` cosines (rows L2-normalised as ``F.normalize``).

    The product runs on one BLAS thread (runtime/blas.py), so its bits do not depend on the
    process's BLAS thread count (a Ray worker's ``OMP_NUM_THREADS=1`` included).
    """
    an, bn = l2_normalize(a), l2_normalize(b)
    with single_thread_blas():
        return an @ bn.T


def best_match_cosines(ref_tokens: np.ndarray, out_tokens: np.ndarray) -> np.ndarray:
    """For each reference patch, the max cosine to any output patch.

    Args:
        ref_tokens: ``[N, D] float32`` reference patch tokens (valid patches only).
        out_tokens: ``[M, D] float32`` output patch tokens (valid patches only), ``M >= 1``.

    Returns:
        ``[N] float32`` in ``[-1, 1]``.
    """
    return cosine_matrix(ref_tokens, out_tokens).max(axis=1)  # [N, M] -> [N]


def masked_maxcos(ref_tokens: np.ndarray, out_tokens: np.ndarray, ref_weights: np.ndarray,
                  fg_threshold: float = 0.5) -> tuple[float, dict]:
    """CP: mean over reference foreground patches of their best cosine to any output patch.

    Args:
        ref_tokens: ``[N, D] float32``; out_tokens: ``[M, D] float32``.
        ref_weights: ``[N] float32`` reference mask on the patch grid, in ``[0, 1]``.
        fg_threshold: a reference patch counts as foreground when its weight is ``> fg_threshold``.

    Returns:
        ``(cp, extras)``: cp in ``[-1, 1]``, NaN when no reference patch is foreground (the
        reference's behaviour); extras ``cp_n_ref_fg``, ``cp_n_ref_total``, ``cp_fg_frac_ref``
        (mean mask weight), as masc-metric 0.3.0.
    """
    keep = ref_weights > np.float32(fg_threshold)
    extras = {"cp_n_ref_fg": int(keep.sum()), "cp_n_ref_total": int(ref_tokens.shape[0]),
              "cp_fg_frac_ref": float(np.mean(ref_weights, dtype=np.float32))}
    if not keep.any():
        return float("nan"), extras
    best = best_match_cosines(ref_tokens[keep], out_tokens)
    return float(np.mean(best, dtype=np.float32)), extras


def background_key_padding_mask(out_weights: np.ndarray, fg_threshold: float = 0.5) -> np.ndarray:
    """PF's key_padding_mask over the output's valid patches: True (hidden) where weight >= thr."""
    return np.asarray(out_weights) >= np.float32(fg_threshold)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine of two ``[D]`` vectors, normalised as ``F.normalize`` does."""
    return float(np.sum(l2_normalize(a) * l2_normalize(b), dtype=np.float32))
