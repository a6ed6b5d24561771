#!/usr/bin/env python
"""Fidelity gates for a reduced-precision path (fp16 / bf16) against the fp32 path.

Given the same pairs scored by both paths, checks (thresholds in masc_engine/tolerances.py):

- per-pair max |Delta CP| and |Delta PF| <= ``FIDELITY_MAX_ABS_DELTA`` (2e-3);
- Spearman of CP and of PF between the paths >= ``FIDELITY_MIN_SPEARMAN`` (0.999);
- at least ``FIDELITY_MIN_PAIRS`` (1,000) pairs;
- pooled-embedding cosine between the paths >= ``FIDELITY_MIN_EMBEDDING_COSINE`` (0.9995), per image;
- no NaN / Inf where the fp32 path is finite, and no Inf anywhere. NaN is allowed only where the
  fp32 path itself is NaN (an undefined score: reference mask keeps nothing, no background).

Pure numpy (no scipy needed: Spearman with average ranks, equal to scipy.stats.spearmanr).

Usage::

    python bench/fidelity_gates.py fp32.npz fp16.npz [--out report.json]

Each ``.npz`` holds ``cp [P]``, ``pf [P]`` and optionally ``embeddings [E, D]`` (pooled
embeddings, same image order in both). Exit status 1 when a gate fails.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np


def _tolerances():
    try:
        from masc_engine import tolerances
    except Exception:  # noqa: BLE001 - a GPU box may lack the runtime's deps; the file is pure constants
        path = Path(__file__).resolve().parents[1] / "src" / "masc_engine" / "tolerances.py"
        spec = importlib.util.spec_from_file_location("_masc_tolerances", path)
        tolerances = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(tolerances)
    return tolerances


def rankdata(x: np.ndarray) -> np.ndarray:
    """Average ranks (1-based), as ``scipy.stats.rankdata(method="average")``."""
    x = np.asarray(x, np.float64)
    order = np.argsort(x, kind="mergesort")
    xs = x[order]
    ranks = np.empty(len(x), np.float64)
    i = 0
    while i < len(x):
        j = i
        while j + 1 < len(x) and xs[j + 1] == xs[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return ranks


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rho (Pearson on average ranks); NaN when either side is constant or n < 2."""
    if len(a) < 2:
        return float("nan")
    ra, rb = rankdata(a), rankdata(b)
    ra -= ra.mean()
    rb -= rb.mean()
    den = np.sqrt((ra * ra).sum() * (rb * rb).sum())
    return float((ra * rb).sum() / den) if den > 0 else float("nan")


def _gate(value, threshold, ok) -> dict:
    return {"value": value, "threshold": threshold, "pass": bool(ok)}


def _nonfinite(ref: np.ndarray, test: np.ndarray) -> dict:
    """Counts of bad values: Inf anywhere, NaN in test where ref is finite, finite where ref is NaN."""
    return {
        "inf": int(np.isinf(ref).sum() + np.isinf(test).sum()),
        "nan_where_ref_finite": int((np.isnan(test) & np.isfinite(ref)).sum()),
        "finite_where_ref_nan": int((np.isfinite(test) & np.isnan(ref)).sum()),
    }


def fidelity_gates(ref: dict, test: dict, tol=None) -> dict:
    """Compare ``test`` (reduced precision) with ``ref`` (fp32).

    Args:
        ref, test: ``{"cp": [P], "pf": [P], "embeddings": [E, D] (optional)}``.

    Returns:
        ``{"pass": bool, "n_pairs": P, "gates": {name: {"value", "threshold", "pass"}}, "detail": {...}}``.
    """
    tol = tol or _tolerances()
    gates, detail = {}, {}
    cp_r, cp_t = np.asarray(ref["cp"], np.float64), np.asarray(test["cp"], np.float64)
    pf_r, pf_t = np.asarray(ref["pf"], np.float64), np.asarray(test["pf"], np.float64)
    if cp_r.shape != cp_t.shape or pf_r.shape != pf_t.shape or cp_r.shape != pf_r.shape:
        raise ValueError(f"shapes differ: cp {cp_r.shape} vs {cp_t.shape}, pf {pf_r.shape} vs {pf_t.shape}")
    n = int(cp_r.shape[0])
    gates["min_pairs"] = _gate(n, tol.FIDELITY_MIN_PAIRS, n >= tol.FIDELITY_MIN_PAIRS)
    bad = {}
    for name, r, t in (("cp", cp_r, cp_t), ("pf", pf_r, pf_t)):
        nf = _nonfinite(r, t)
        bad[name] = nf
        both = np.isfinite(r) & np.isfinite(t)
        d = np.abs(r[both] - t[both])
        max_d = float(d.max()) if d.size else float("nan")
        gates[f"max_abs_delta_{name}"] = _gate(
            max_d, tol.FIDELITY_MAX_ABS_DELTA, d.size > 0 and max_d <= tol.FIDELITY_MAX_ABS_DELTA
        )
        rho = spearman(r[both], t[both])
        gates[f"spearman_{name}"] = _gate(
            rho, tol.FIDELITY_MIN_SPEARMAN, np.isfinite(rho) and rho >= tol.FIDELITY_MIN_SPEARMAN
        )
        detail[name] = {
            "n_finite": int(both.sum()),
            "mean_abs_delta": float(d.mean()) if d.size else float("nan"),
            "p99_abs_delta": float(np.quantile(d, 0.99)) if d.size else float("nan"),
            "ref_std": float(np.std(r[both])) if d.size else float("nan"),
            **nf,
        }
    if "embeddings" in ref and "embeddings" in test:
        er, et = np.asarray(ref["embeddings"], np.float64), np.asarray(test["embeddings"], np.float64)
        if er.shape != et.shape:
            raise ValueError(f"embedding shapes differ: {er.shape} vs {et.shape}")
        nf = _nonfinite(er, et)
        bad["embeddings"] = nf
        rows = np.isfinite(er).all(axis=1) & np.isfinite(et).all(axis=1)
        num = (er[rows] * et[rows]).sum(axis=1)
        den = np.linalg.norm(er[rows], axis=1) * np.linalg.norm(et[rows], axis=1)
        cos = num / np.maximum(den, 1e-30)
        worst = float(cos.min()) if cos.size else float("nan")
        gates["min_embedding_cosine"] = _gate(
            worst, tol.FIDELITY_MIN_EMBEDDING_COSINE, cos.size > 0 and worst >= tol.FIDELITY_MIN_EMBEDDING_COSINE
        )
        detail["embeddings"] = {
            "n": int(rows.sum()),
            "mean_cosine": float(cos.mean()) if cos.size else float("nan"),
            **nf,
        }
    total_bad = sum(v for nf in bad.values() for v in nf.values())
    gates["no_nan_inf"] = _gate(total_bad, 0, total_bad == 0)
    return {"pass": all(g["pass"] for g in gates.values()), "n_pairs": n, "gates": gates, "detail": detail}


def _load(path: str) -> dict:
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ref", help="fp32 scores (.npz with cp, pf[, embeddings])")
    ap.add_argument("test", help="reduced-precision scores, same pairs and order")
    ap.add_argument("--out", help="write the JSON report here")
    args = ap.parse_args(argv)
    report = fidelity_gates(_load(args.ref), _load(args.test))
    text = json.dumps(report, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    return 0 if report["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
