"""The CP head as a graph: a batched masked max-cosine, one reference against many outputs.

``cp.onnx`` computes masc-metric 0.3.0's concept preservation (``MaSC._concept_preservation``,
numpy port: runtime/heads.py ``masked_maxcos``) for many pairs in one call. Pairs are grouped by
reference (``R`` references, up to ``K`` outputs each), because a benchmark scores one
reference against many outputs (methods x prompts x seeds):

- ``ref_tokens [R, N, D] f32``: reference patch tokens, padded to ``N``.
- ``ref_keep [R, N] bool``: reference patches counted in the mean (mask weight > fg_threshold);
  False on padding slots.
- ``out_tokens [R, K, M, D] f32``: the outputs scored against reference ``r``, padded to ``M``
  patches and to ``K`` outputs.
- ``out_valid [R, K, M] bool``: real output patches (False on padding slots and on whole padding
  outputs).

->

- ``cp [R, K] f32``: mean over kept reference patches of their best cosine to any valid output
  patch. A reference with no kept patch gives 0 here (finite), never NaN: the runtime reads
  ``n_keep`` and reports NaN itself, as the reference does.
- ``best [R, K, N] f32``: each reference patch's best cosine; 0 where ``ref_keep`` is False.
- ``n_keep [R] f32``: kept reference patches per reference.

A padding output (no valid patch) scores ``INVALID_FILL`` (-4, outside [-1, 1]); the runtime
never reads it.

Memory traffic: every reference token is read and normalised once per call, not once per pair;
the cosine matrix is one batched GEMM ``[N, D] @ [D, K*M]`` per reference (wide enough to keep a
GPU's tensor cores busy), then a max over ``M`` and a masked mean over ``N``. With a ``[B, N, D]``
reference input, scoring one reference against ``B`` outputs would read (and on a GPU, upload)
the reference ``B`` times. ``K = 1`` is the plain pairwise case (``R = B`` pairs).

Masks are applied with ``Where`` and finite constants (no ``-inf``, no division by a count that
can be 0), so a fully masked row stays finite in fp32, fp16 and bf16.
"""

from __future__ import annotations

import torch
from torch import nn

from ..runtime.heads import INVALID_FILL, NORMALIZE_EPS  # noqa: F401  (one definition, shared)
from .graphs import GraphSpec, TensorSpec

# INVALID_FILL (-4): cosine given to padding output patches before the max; below every real
# cosine (>= -1) and exactly representable in fp16/bf16. NORMALIZE_EPS: F.normalize's eps.


class MaskedMaxCosHead(nn.Module):
    """CP for ``R`` references x ``K`` outputs each; see the module docstring for I/O."""

    def forward(self, ref_tokens, ref_keep, out_tokens, out_valid):
        r, n, d = ref_tokens.shape
        k, m = out_tokens.shape[1], out_tokens.shape[2]
        ref_n = ref_tokens / torch.clamp(torch.linalg.vector_norm(ref_tokens, dim=-1, keepdim=True), min=NORMALIZE_EPS)
        out_n = out_tokens / torch.clamp(torch.linalg.vector_norm(out_tokens, dim=-1, keepdim=True), min=NORMALIZE_EPS)
        sims = ref_n @ out_n.reshape(r, k * m, d).transpose(1, 2)  # [R, N, K*M]: one GEMM per reference
        sims = sims.reshape(r, n, k, m)
        sims = torch.where(out_valid[:, None, :, :], sims, torch.full_like(sims, INVALID_FILL))
        best = sims.amax(dim=-1).transpose(1, 2)  # [R, K, N]
        keep = ref_keep.to(best.dtype)  # [R, N]
        best = best * keep[:, None, :]  # masked entries exactly 0
        n_keep = keep.sum(dim=-1)  # [R]
        cp = best.sum(dim=-1) / torch.clamp(n_keep, min=1.0)[:, None]
        return cp, best, n_keep


def cp_spec(width: int) -> GraphSpec:
    """The ``cp`` graph for tokens of width ``width`` (the vision tower's hidden size).

    The trace uses a distinct size for every dynamic axis (none of them 1), so torch.export keeps
    each one symbolic.
    """

    def example():
        g = torch.Generator().manual_seed(4)
        r, k, n, m = 2, 3, 5, 7
        ref = torch.randn(r, n, width, generator=g)
        keep = torch.rand(r, n, generator=g) > 0.3
        out = torch.randn(r, k, m, width, generator=g)
        valid = torch.ones(r, k, m, dtype=torch.bool)
        valid[1, 2, 4:] = False
        return ref, keep, out, valid

    return GraphSpec(
        name="cp",
        file="cp.onnx",
        inputs=[
            TensorSpec("ref_tokens", "float32", ("refs", "ref_patches", width)),
            TensorSpec("ref_keep", "bool", ("refs", "ref_patches")),
            TensorSpec("out_tokens", "float32", ("refs", "outs_per_ref", "out_patches", width)),
            TensorSpec("out_valid", "bool", ("refs", "outs_per_ref", "out_patches")),
        ],
        outputs=[
            TensorSpec("cp", "float32", ("refs", "outs_per_ref")),
            TensorSpec("best", "float32", ("refs", "outs_per_ref", "ref_patches")),
            TensorSpec("n_keep", "float32", ("refs",)),
        ],
        module=MaskedMaxCosHead().eval(),
        example=example,
        extra={
            "invalid_fill": INVALID_FILL,
            "normalize_eps": NORMALIZE_EPS,
            "semantics": "masked_maxcos: cp = mean over ref_keep of max over out_valid of cosine; "
            "n_keep == 0 -> cp 0 in the graph, NaN in the runtime",
        },
    )
