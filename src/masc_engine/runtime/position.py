"""NaFlex position-embedding resize as a matrix, computed outside the graph and cached per grid.

SigLIP2 NaFlex keeps a square ``G x G`` grid of learned position embeddings and resizes it to each
image's patch grid ``(Hp, Wp)`` with ``F.interpolate(mode="bilinear", align_corners=False,
antialias=True)``. TensorRT has no antialiased Resize, so the resize runs here: it is linear, so
it is a ``[N, G*G]`` weight matrix applied to the flattened table inside the vision graph
(``position_weights @ position_table``). The matrix depends on the grid only, hence the cache.

Ported from transformers 5.24.0 ``models/siglip2/modeling_siglip2.py``
``Siglip2VisionEmbeddings.resize_positional_embeddings`` (same float32 arithmetic, same order),
which is itself the closed form of torch's antialiased bilinear kernel. Padding slots take the
weights of output position ``(0, 0)``, as the reference does.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np


@lru_cache(maxsize=1024)
def _axis_weights(grid_size: int, out_size: int) -> np.ndarray:
    """``[out_size, grid_size] float32``: antialiased bilinear weights along one axis."""
    g = np.float32(grid_size)
    scale = g / np.float32(out_size)
    support = max(scale, np.float32(1.0))
    center = (np.arange(out_size, dtype=np.float32) + np.float32(0.5)) * scale - np.float32(0.5)
    source = np.arange(grid_size, dtype=np.float32)
    w = np.clip(np.float32(1.0) - np.abs(source[None, :] - center[:, None]) / support, 0.0, None)
    w = w.astype(np.float32)
    weights: np.ndarray = (w / w.sum(-1, keepdims=True)).astype(np.float32)
    return weights


@lru_cache(maxsize=1024)
def position_weights(grid_size: int, spatial_shape: tuple[int, int], max_length: int) -> np.ndarray:
    """The resize matrix for one patch grid.

    Args:
        grid_size: side ``G`` of the model's square position-embedding grid (16 for SigLIP2 NaFlex).
        spatial_shape: the image's patch grid ``(Hp, Wp)``, ``Hp * Wp <= max_length``.
        max_length: sequence length (the patch budget); rows past ``Hp * Wp`` are padding slots.

    Returns:
        ``[max_length, G*G] float32``, read-only (shared by the cache). Row ``i`` holds the weights
        of output patch ``(i // Wp, i % Wp)``; padding rows repeat row 0.

    Raises:
        ValueError: empty grid or ``Hp * Wp > max_length``.
    """
    hp, wp = spatial_shape
    if hp <= 0 or wp <= 0 or hp * wp > max_length:
        raise ValueError(f"patch grid {hp}x{wp} does not fit a sequence of {max_length}")
    wh = _axis_weights(grid_size, hp)  # [Hp, G]
    ww = _axis_weights(grid_size, wp)  # [Wp, G]
    full = (wh[:, None, :, None] * ww[None, :, None, :]).reshape(hp * wp, grid_size * grid_size)
    out = np.empty((max_length, grid_size * grid_size), dtype=np.float32)
    out[: hp * wp] = full
    out[hp * wp :] = full[0]
    out.setflags(write=False)
    return out
