"""CP through the bundle's ``cp`` graph (export/cp_head.py) on any backend runner.

Torch-free. :class:`GraphCP` packs many (reference, output) pairs into few calls of the ``cp``
graph: pairs are grouped by reference (the same token array and the same kept patches), so a
reference is read once per call however many outputs it is scored against; references are padded
to the longest in the call, outputs to the longest output.

Results equal runtime/heads.py ``masked_maxcos`` within ``tolerances.CP_HEAD_ATOL`` on ONNX
Runtime CPU and through runtime/heads.py ``cp_forward`` (the graph's arithmetic on numpy or CuPy;
tests/test_cp_head.py). The graph never yields
NaN; a reference with no kept patch gets NaN here, from the kept-patch count.

With a token ``device`` (engine/device.py) the tokens are device arrays: calls are packed on the
device and run with ``runner.run_device``, and only ``cp`` (and ``best`` when asked) come back to
the host. The masks are built on the host (a few bytes per patch) and copied by the backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import numpy as np

from .masks import DEFAULT_FG_THRESHOLD, cp_keep

if TYPE_CHECKING:
    from ..engine.backends.base import Runner
    from ..engine.device import ArrayDevice

#: A group of items sharing one reference: ``(id of its tokens, its kept-patch mask's bytes)``.
_Key = tuple[int, bytes]
#: One reference slot of a call: its key and the indices of its items.
_Slot = tuple[_Key, list[int]]

#: Default cap on one call's cosine tensor ``R * K * N * M`` (float32 elements): 2**26 = 256 MiB.
#: It also bounds a TensorRT CP engine's context memory, which is sized per call for the shapes run
#: (engine/backends/tensorrt.py; at so400m shapes about 0.7 GiB with the fp32 reduction and the
#: normalised copies, against 2.7 GiB at the default profile's 16 x 16 x 1024 x 1024).
DEFAULT_MAX_SIMS = 1 << 26


@dataclass
class CPItem:
    """One pair for the CP head.

    Attributes:
        ref_tokens: ``[N, D] float32`` reference patch tokens (real patches only). Pairs that pass
            the *same array object* (and the same kept patches) share one reference slot.
        ref_weights: ``[N] float32`` reference mask on the patch grid.
        out_tokens: ``[M, D] float32`` output patch tokens (real patches only), ``M >= 1``.
    """

    ref_tokens: np.ndarray
    ref_weights: np.ndarray
    out_tokens: np.ndarray


class GraphCP:
    """Masked max-cosine (CP) for many pairs through a ``cp`` graph runner.

    Args:
        runner: a :class:`~masc_engine.engine.backends.base.Runner` for the bundle's ``cp`` graph.
        fg_threshold: a reference patch is kept when its weight is ``> fg_threshold``.
        max_outs_per_ref: outputs per reference slot in one call (``K``); larger groups are split
            into several slots, so any number of outputs per reference is scored. Capped by the
            runner's ``axis_limit("outs_per_ref")`` when it has one (a TensorRT engine's profile,
            where ``outs_per_ref`` is a bounded axis: a larger ``K`` would be refused).
        max_refs_per_call: reference slots per call (``R``); capped by the runner's
            ``axis_limit("refs")`` when it has one (a larger call would be split into several runs).
        max_sims: cap on ``R * K * N * M`` per call (the cosine tensor's size).
        device: the token device (engine/device.py) when tokens are device arrays;
            ``None``: host numpy arrays through ``runner.run``.
    """

    def __init__(
        self,
        runner: Runner,
        fg_threshold: float = DEFAULT_FG_THRESHOLD,
        max_outs_per_ref: int = 64,
        max_refs_per_call: int = 16,
        max_sims: int = DEFAULT_MAX_SIMS,
        device: ArrayDevice | None = None,
    ) -> None:
        self.runner = runner
        self.device = device
        self.fg_threshold = float(fg_threshold)
        self.max_outs_per_ref = max(1, int(max_outs_per_ref))
        limit = getattr(runner, "axis_limit", None)
        cap = limit("outs_per_ref") if callable(limit) else None
        if cap is not None:
            self.max_outs_per_ref = min(self.max_outs_per_ref, max(1, int(cap)))
        self.max_refs_per_call = max(1, int(max_refs_per_call))
        refs = limit("refs") if callable(limit) else None
        if refs is not None:
            self.max_refs_per_call = min(self.max_refs_per_call, max(1, int(refs)))
        self.max_sims = max(1, int(max_sims))

    def score(
        self, ref_tokens: np.ndarray, ref_weights: np.ndarray, outputs: Sequence[np.ndarray]
    ) -> list[tuple[float, dict[str, Any]]]:
        """One reference against many outputs: ``[(cp, extras)]`` per output."""
        return self.score_items([CPItem(ref_tokens, ref_weights, o) for o in outputs])

    def score_items(self, items: Sequence[CPItem], return_best: bool = False) -> list[tuple[float, dict[str, Any]]]:
        """``(cp, extras)`` per item, as ``heads.masked_maxcos`` returns them.

        ``extras`` are ``cp_n_ref_fg``, ``cp_n_ref_total``, ``cp_fg_frac_ref`` (and ``best``, the
        ``[N]`` best cosines with 0 on unkept patches, when ``return_best``). cp is NaN when the
        reference keeps no patch.

        Raises:
            ValueError: an output without patches, or tokens of mismatched width.
        """
        items = list(items)
        results: list[Any] = [None] * len(items)  # every slot filled by _run_call
        groups: dict[_Key, list[int]] = {}
        keeps: dict[_Key, np.ndarray] = {}
        for i, it in enumerate(items):
            if it.out_tokens.ndim != 2 or it.out_tokens.shape[0] == 0:
                raise ValueError(f"item {i}: output tokens must be [M >= 1, D], got {it.out_tokens.shape}")
            if it.ref_tokens.ndim != 2 or it.ref_tokens.shape[1] != it.out_tokens.shape[1]:
                raise ValueError(
                    f"item {i}: reference {it.ref_tokens.shape} and output {it.out_tokens.shape} "
                    "tokens must be [N, D] and [M, D]"
                )
            keep = np.asarray(cp_keep(it.ref_weights, self.fg_threshold))
            key = (id(it.ref_tokens), keep.tobytes())
            groups.setdefault(key, []).append(i)
            keeps[key] = keep
        # Slots: (reference key, item indices), at most max_outs_per_ref items each.
        slots = [
            (key, idx[s : s + self.max_outs_per_ref])
            for key, idx in groups.items()
            for s in range(0, len(idx), self.max_outs_per_ref)
        ]
        for call in self._pack(slots, items):
            self._run_call(call, items, keeps, results, return_best)
        return results

    def _pack(self, slots: list[_Slot], items: list[CPItem]) -> Iterator[list[_Slot]]:
        """Greedy packing of slots into calls within ``max_refs_per_call`` and ``max_sims``."""
        call: list[_Slot] = []
        n_max, m_max, k_max = 0, 0, 0
        for key, idx in slots:
            n = items[idx[0]].ref_tokens.shape[0]
            m = max(items[i].out_tokens.shape[0] for i in idx)
            nn_, mm, kk = max(n_max, n), max(m_max, m), max(k_max, len(idx))
            if call and (len(call) + 1 > self.max_refs_per_call or (len(call) + 1) * kk * nn_ * mm > self.max_sims):
                yield call
                call, nn_, mm, kk = [], n, m, len(idx)
            call.append((key, idx))
            n_max, m_max, k_max = nn_, mm, kk
        if call:
            yield call

    def _run_call(
        self,
        call: list[_Slot],
        items: list[CPItem],
        keeps: dict[_Key, np.ndarray],
        results: list[Any],
        return_best: bool,
    ) -> None:
        first = items[call[0][1][0]]
        d = first.ref_tokens.shape[1]
        r = len(call)
        k = max(len(idx) for _, idx in call)
        n = max(items[idx[0]].ref_tokens.shape[0] for _, idx in call)
        m = max(items[i].out_tokens.shape[0] for _, idx in call for i in idx)
        dev = self.device
        alloc = np.zeros if dev is None else dev.zeros
        ref = alloc((r, n, d), np.float32)
        ref_keep = np.zeros((r, n), bool)
        out = alloc((r, k, m, d), np.float32)
        valid = np.zeros((r, k, m), bool)
        for a, (key, idx) in enumerate(call):
            rt = items[idx[0]].ref_tokens
            ref[a, : rt.shape[0]] = rt
            ref_keep[a, : rt.shape[0]] = keeps[key]
            for b, i in enumerate(idx):
                ot = items[i].out_tokens
                out[a, b, : ot.shape[0]] = ot
                valid[a, b, : ot.shape[0]] = True
        feeds = {"ref_tokens": ref, "ref_keep": ref_keep, "out_tokens": out, "out_valid": valid}
        if dev is None:
            res = self.runner.run(feeds)
            cp = res["cp"]
            best: np.ndarray | None = res["best"]
        else:
            res = self.runner.run_device(feeds, dev)
            cp = dev.to_host(res["cp"])
            best = dev.to_host(res["best"]) if return_best else None
        for a, (key, idx) in enumerate(call):
            keep = keeps[key]
            n_fg = int(keep.sum())
            for b, i in enumerate(idx):
                it = items[i]
                extras: dict[str, Any] = {
                    "cp_n_ref_fg": n_fg,
                    "cp_n_ref_total": int(it.ref_tokens.shape[0]),
                    "cp_fg_frac_ref": float(np.mean(it.ref_weights, dtype=np.float32)),
                }
                if return_best and best is not None:  # (best is read back whenever return_best)
                    extras["best"] = np.array(best[a, b, : it.ref_tokens.shape[0]])
                results[i] = (float("nan") if n_fg == 0 else float(cp[a, b]), extras)
