"""One-line mutations of the gates, the export plan, the input guards and limits, the scoring rules and the metrics: caught?

Each mutation replaces one exact line fragment of a source file (it must occur exactly once),
runs the tests that cover that rule (``pytest -x -q``), and restores the file, whatever happens.
A mutation is *caught* when the tests fail. Survivors are listed with the reason each is
equivalent (no user-visible change) when one is recorded here; an unexplained survivor is a gap.

    python bench/mutations.py --out bench/results/mutations.json

Runs in this checkout (it edits and restores files under src/); do not run it beside uncommitted
edits of the same files. About 7 minutes on 2 cores (64 mutations: 434 s on a 2-core AMD EPYC).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src" / "masc_engine"
GATES = "tests/test_gates.py"
VALUES = "tests/test_gates_values.py"
REFUSAL = "tests/test_gates_refusal.py"
CERT = "tests/test_certification.py"
BUDGETS = "tests/test_run_budgets.py"
#: The tests of each rule the fresh sets mutate: a file's byte cap, the mask threshold, CP's
#: mean of best matches (each against the oracle too), the agreement metrics, the ranking.
FILE_CAP = [BUDGETS, "-k", "reads_at_most or byte_cap or regular"]
MASK_RULE = ["tests/test_masks.py", "tests/test_heads.py", "tests/test_oracle.py"]
CP_RULE = ["tests/test_heads.py", "tests/test_cp_head.py", "tests/test_oracle.py"]
AGREEMENT = ["tests/test_agreement.py"]
RANKING = ["tests/test_rank.py", "tests/test_ranked.py"]
#: The fast tests of a file (no bundle export).
FAST = ["-k", "not fg_threshold and not masc_export"]

#: (name, file under src/masc_engine, old fragment, new fragment, test files or node ids)
MUTATIONS = [
    # the survivors of the earlier mutation run
    (
        "gate delta without abs",
        "metrics/certification.py",
        "d = np.abs(r[both] - t[both])",
        "d = r[both] - t[both]",
        [GATES, CERT, *FAST],
    ),
    (
        "held-out set not gating",
        "export/cpu_precision.py",
        'if held is not None and held["pass"]:',
        "if held is not None:",
        [GATES, *FAST],
    ),
    (
        "default max_keep: every unit",
        "export/cpu_precision.py",
        "len(names) // 2 if max_keep is None",
        "len(names) if max_keep is None",
        [GATES, *FAST],
    ),
    (
        "FIDELITY_MIN_SPEARMAN 0.99",
        "tolerances.py",
        "FIDELITY_MIN_SPEARMAN = 0.999",
        "FIDELITY_MIN_SPEARMAN = 0.99",
        [VALUES],
    ),
    ("INT8_MIN_SPEARMAN 0.95", "tolerances.py", "INT8_MIN_SPEARMAN = 0.995", "INT8_MIN_SPEARMAN = 0.95", [VALUES]),
    (
        "OpenVINO f32 check or -> and",
        "engine/backends/openvino.py",
        'x["precision"] == "bf16" or "bf16" in x["outputs"]',
        'x["precision"] == "bf16" and "bf16" in x["outputs"]',
        [GATES, *FAST],
    ),
    (
        "bf16 planned like fp32",
        "export/stages.py",
        '([] if precision == "fp32" else',
        '([] if precision in ("fp32", "bf16") else',
        [GATES, *FAST],
    ),
    (
        "peak stage by name",
        "export/stages.py",
        "max(self.stages.items(), key=lambda kv: kv[1])",
        "max(self.stages.items())",
        [GATES, *FAST],
    ),
    (
        "cgroup limit: max",
        "export/stages.py",
        "return min(limits) if limits else None",
        "return max(limits) if limits else None",
        [GATES, *FAST],
    ),
    (
        "sampled peak drops VmHWM",
        "export/stages.py",
        "return max(peak, hwm) if rose else peak",
        "return peak",
        [GATES, *FAST],
    ),
    (
        "fg_threshold truthiness",
        "runtime/config.py",
        'if self.fg_threshold is not None\n                else m["scoring"]',
        'if self.fg_threshold\n                else m["scoring"]',
        [GATES + "::test_fg_threshold_zero_scores_at_zero"],
    ),
    (
        "segmenter reservation overwritten",
        "jobs/items.py",
        "cost += masks.reserve_bytes(opened.size)",
        "cost = masks.reserve_bytes(opened.size)",
        [GATES, *FAST],
    ),
    (
        "DecompressionBombWarning ignored",
        "runtime/io.py",
        'warnings.simplefilter("error", Image.DecompressionBombWarning)',
        'warnings.simplefilter("ignore", Image.DecompressionBombWarning)',
        [GATES, *FAST],
    ),
    # fresh mutations of the same modules
    (
        "gate Spearman > instead of >=",
        "metrics/certification.py",
        "rho >= gates.min_spearman,",
        "rho > gates.min_spearman + 1e-4,",
        [GATES, CERT, *FAST],
    ),
    (
        "gate max delta loosened",
        "metrics/certification.py",
        "worst <= bound)",
        "worst <= 10 * bound)",
        [GATES, CERT, *FAST],
    ),
    (
        "min_pairs not gating",
        "metrics/certification.py",
        "_gate(n, min_pairs, n >= min_pairs, upper=False)",
        "_gate(n, min_pairs, True, upper=False)",
        [GATES, CERT, *FAST],
    ),
    (
        "bf16 non-finite pairs dropped",
        "metrics/certification.py",
        'FIDELITY_MIN_SPEARMAN, "gate")',
        'FIDELITY_MIN_SPEARMAN, "drop")',
        [CERT],
    ),
    (
        "bf16 |dPF| not gated",
        "metrics/certification.py",
        "GateSet(FIDELITY_MAX_ABS_DELTA, FIDELITY_MAX_ABS_DELTA,",
        "GateSet(FIDELITY_MAX_ABS_DELTA, None,",
        [CERT],
    ),
    (
        "gate margins from values",
        "metrics/certification.py",
        '"margins": {k: records[k]["margin"]',
        '"margins": {k: records[k]["value"]',
        [CERT, REFUSAL, *FAST],
    ),
    ("max_keep off by one", "export/cpu_precision.py", "if k > max_keep:", "if k > max_keep + 1:", [GATES, *FAST]),
    (
        "int8 delta gate dropped",
        "metrics/certification.py",
        "INT8_GATES = GateSet(INT8_MAX_ABS_DCP,",
        "INT8_GATES = GateSet(None,",
        [GATES, *FAST],
    ),
    (
        "int8 Spearman gate dropped",
        "metrics/certification.py",
        'None, INT8_MIN_SPEARMAN, "drop")',
        'None, -1.0, "drop")',
        [REFUSAL, *FAST],
    ),
    (
        "fp16 planned without the pairs stage",
        "export/stages.py",
        '["precision", "pairs"])',
        '["precision"])',
        [GATES, *FAST],
    ),
    (
        "cgroup 'max' read as a limit",
        "export/stages.py",
        "if text.isdigit() and int(text) < 1 << 60:",
        "if text.isdigit():",
        [GATES, *FAST],
    ),
    (
        "validation override ignored",
        "export/validation_gates.py",
        "if accepted is not None and error <= accepted:",
        "if accepted is not None:",
        [REFUSAL, *FAST],
    ),
    (
        "validation refusal without the way out",
        "export/validation_gates.py",
        '" to export anyway (recorded in the manifest)"',
        '""',
        [REFUSAL, *FAST],
    ),
    (
        "SigLIP gate on the absolute error",
        "export/validation_gates.py",
        'worst = max(c["max_rel"] for c in cases)',
        'worst = max(c["max_abs"] for c in cases)',
        [REFUSAL, *FAST],
    ),
    (
        "gate margin sign flipped",
        "metrics/certification.py",
        "margin = threshold - value if upper else value - threshold",
        "margin = value - threshold if upper else threshold - value",
        [REFUSAL, *FAST],
    ),
    (
        "override bound rounded down",
        "export/validation_gates.py",
        "return float(np.ceil(x / e) * e)",
        "return float(np.floor(x / e) * e)",
        [REFUSAL, *FAST],
    ),
    (
        "override outlives its block",
        "export/validation_gates.py",
        "        _ACCEPTED[0] = before",
        "        pass",
        [REFUSAL, *FAST],
    ),
    (
        "non-finite error accepted by the override",
        "export/validation_gates.py",
        "if accepted is not None and error <= accepted:",
        "if accepted is not None and not error > accepted:",
        [REFUSAL, *FAST],
    ),
    (
        "int8 thresholds not from the report",
        "jobs/int8_gate.py",
        'm, t = report["margins"], gate_thresholds(report)',
        'm, t = report["margins"], {"max_abs_dcp": 1.0, "spearman_cp": 0.0}',
        [REFUSAL, *FAST],
    ),
    ("RAM figure ignored", "export/stages.py", "limits.append(int(line.split()[1]) * 1024)", "pass", [GATES, *FAST]),
    # a third attack: gates at their exact edges, the recipe's own rescale, pinned export budgets
    (
        "|d| gate exclusive at the bound",
        "metrics/certification.py",
        'records[f"max_abs_d{k}"] = _gate(worst, bound, worst <= bound)',
        'records[f"max_abs_d{k}"] = _gate(worst, bound, worst < bound)',
        [CERT],
    ),
    (
        "Spearman gate exclusive at the bound",
        "metrics/certification.py",
        "np.isfinite(rho) and rho >= gates.min_spearman",
        "np.isfinite(rho) and rho > gates.min_spearman",
        [CERT],
    ),
    (
        "infinite on both sides accepted",
        "metrics/certification.py",
        "(np.isfinite(r) != np.isfinite(t)).sum() + np.isinf(t).sum()",
        "(np.isfinite(r) != np.isfinite(t)).sum()",
        [CERT],
    ),
    (
        "exact gate met loads infinity",
        "metrics/certification.py",
        "return 0.0 if used <= 0 else",
        "return 0.0 if used < 0 else",
        [CERT],
    ),
    (
        "recipe rescale factor ignored",
        "runtime/recipes.py",
        "rescale_normalise(pixels, recipe.rescale_factor,",
        "rescale_normalise(pixels, 1 / 255,",
        ["tests/test_recipes.py"],
    ),
    (
        "clipseg-tiny end-to-end floor doubled",
        "tolerances.py",
        '"decoder": 2e-5, "end_to_end": 5e-5}',
        '"decoder": 2e-5, "end_to_end": 1e-4}',
        [VALUES],
    ),
    (
        "tiny text budget doubled",
        "tolerances.py",
        '"pool": 2e-6, "text": 7e-6}',
        '"pool": 2e-6, "text": 1.4e-5}',
        [VALUES],
    ),
    (
        "clipseg-rd64 decoder floor back to 4e-6",
        "tolerances.py",
        '"decoder": 5e-6, "end_to_end": 1e-5}',
        '"decoder": 4e-6, "end_to_end": 1e-5}',
        [VALUES, "tests/test_gates_distributions.py", "-m", "not slow"],
    ),
    (
        "worker stops at a library it cannot import",
        "export/torch_worker.py",
        "        except ImportError:\n            pass\n    gc.collect()",
        "        except ImportError:\n            raise\n    gc.collect()",
        ["tests/test_export_refusals.py", "-k", "freezes"],
    ),
    (
        "worker freezes nothing",
        "export/torch_worker.py",
        "    gc.collect()\n    gc.freeze()",
        "    gc.collect()",
        ["tests/test_export_refusals.py", "-k", "freezes"],
    ),
    # a fresh set: the input limits of masc-run and masc-serve, each at its edge
    (
        "limits: a file read past its cap",
        "runtime/io.py",
        "data = f.read(cap + 1)",
        "data = f.read()",
        FILE_CAP,
    ),
    (
        "limits: a file of exactly the cap refused",
        "runtime/io.py",
        "    if st.st_size > cap:",
        "    if st.st_size >= cap:",
        FILE_CAP,
    ),
    (
        "limits: token budget off by one",
        "runtime/text.py",
        "if n > self.max_tokens:",
        "if n > self.max_tokens + 1:",
        [BUDGETS, "tests/test_serve_text_budget.py", "-k", "token or object_name"],
    ),
    (
        "limits: a text upload read whole",
        "serve/parsing.py",
        "await v.read(cfg.max_prompt_bytes + 1)",
        "await v.read()",
        ["tests/test_serve_multipart.py", "tests/test_serve_hostile.py", "-k", "multipart or prompts"],
    ),
    (
        "limits: a body of exactly --max-body-mb refused",
        "serve/limits.py",
        "if n > self.max_bytes:",
        "if n >= self.max_bytes:",
        ["tests/test_serve_guard_edges.py"],
    ),
    (
        "limits: one request past --max-connections",
        "serve/limits.py",
        "self.in_flight >= self.max_in_flight",
        "self.in_flight > self.max_in_flight",
        ["tests/test_serve_guard_edges.py"],
    ),
    (
        "limits: two Authorization headers accepted",
        "serve/limits.py",
        'if len(values) > 1 or (b"," in given and not ok):',
        'if b"," in given and not ok:',
        ["tests/test_serve_exposure.py", "-k", "authorization"],
    ),
    (
        "limits: Content-Length with Transfer-Encoding accepted",
        "serve/limits.py",
        'if b"content-length" in names and b"transfer-encoding" in names:',
        "if False:",
        ["tests/test_serve_exposure.py", "-k", "length_headers"],
    ),
    (
        "limits: body deadline doubled",
        "serve/limits.py",
        "self.deadline = time.monotonic() + timeout_s",
        "self.deadline = time.monotonic() + 2 * timeout_s",
        ["tests/test_serve_guard_edges.py"],
    ),
    # a fresh set: the scoring rules (the mask threshold, masked_maxcos) and the metrics (AUC,
    # Krippendorff's alpha, mAP and CMC), each caught by a comparison with its reference
    (
        "CP keeps reference patches at the threshold",
        "runtime/masks.py",
        "return _weights(ref_weights) > np.float32(threshold)",
        "return _weights(ref_weights) >= np.float32(threshold)",
        MASK_RULE,
    ),
    (
        "PF shows output patches at the threshold",
        "runtime/masks.py",
        "return _weights(weights) >= np.float32(threshold)",
        "return _weights(weights) > np.float32(threshold)",
        MASK_RULE,
    ),
    (
        "masked_maxcos: median of the maxima",
        "runtime/heads.py",
        "return float(xp.mean(best, dtype=xp.float32)), extras",
        "return float(xp.median(best)), extras",
        CP_RULE,
    ),
    (
        "masked_maxcos: mean cosine, not the best match",
        "runtime/heads.py",
        "cosine_matrix(ref_tokens, out_tokens, xp).max(axis=1)",
        "cosine_matrix(ref_tokens, out_tokens, xp).mean(axis=1)",
        CP_RULE,
    ),
    (
        "CP head: the mean over one patch more",
        "runtime/heads.py",
        "cp = best.sum(axis=-1) / xp.maximum(n_keep, xp.float32(1.0))[:, None]",
        "cp = best.sum(axis=-1) / xp.maximum(n_keep + 1, xp.float32(1.0))[:, None]",
        CP_RULE,
    ),
    (
        "AUC: a tie counted as a win",
        "metrics/agreement/auc.py",
        "below + 0.5 * c_neg",
        "below + 1.0 * c_neg",
        AGREEMENT,
    ),
    (
        "alpha: mid-ranks at the top of each tie",
        "metrics/agreement/alpha.py",
        "midrank = np.cumsum(counts) - counts / 2.0",
        "midrank = np.cumsum(counts) - counts",
        AGREEMENT,
    ),
    (
        "alpha: units with one coder pairable",
        "metrics/agreement/alpha.py",
        "keep = m_u >= 2",
        "keep = m_u >= 1",
        AGREEMENT,
    ),
    (
        "ranking: ties resolved in the relevant item's favour",
        "metrics/retrieval.py",
        "r.astype(np.int8), -s))",
        "-r.astype(np.int8), -s))",
        RANKING,
    ),
    (
        "CMC: rank k not counted at k",
        "metrics/retrieval.py",
        "(ranks <= k).mean()",
        "(ranks < k).mean()",
        RANKING,
    ),
    (
        "AP: precision one rank late",
        "metrics/retrieval.py",
        "return float(np.mean(np.arange(1, pos.size + 1) / pos))",
        "return float(np.mean(np.arange(1, pos.size + 1) / (pos + 1)))",
        RANKING,
    ),
    (
        "top-k: rank k not in the top k",
        "metrics/retrieval.py",
        "self.first_rank <= k",
        "self.first_rank < k",
        RANKING,
    ),
]


#: Survivors that change nothing a user can see, and why (listed with the result, not counted as caught).
EQUIVALENT = {
    "limits: a text upload read whole": (
        "Starlette's multipart parser creates every UploadFile with size=0 and adds each chunk it "
        "writes (starlette/formparsers.py, datastructures.py UploadFile.write), so the size check "
        "before the read refuses every upload over --max-prompt-bytes and the read only ever sees "
        "one within it; the bounded read guards an UploadFile of unknown size, which no request makes"
    ),
}


def _cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), for the results file."""
    try:
        return next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown"


def _version() -> str:
    from importlib.metadata import version

    return version("masc-engine")


def run_one(m, env) -> dict:
    name, rel, old, new, tests = m
    path = SRC / rel
    text = path.read_text(encoding="utf-8")
    if text.count(old) != 1:
        return {"name": name, "file": rel, "result": "not applied", "why": f"fragment found {text.count(old)} times"}
    t0 = time.time()
    try:
        path.write_text(text.replace(old, new), encoding="utf-8")
        p = subprocess.run(
            [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
    finally:
        path.write_text(text, encoding="utf-8")
    tail = [ln for ln in p.stdout.splitlines() if ln.startswith("FAILED")][:1]
    return {
        "name": name,
        "file": rel,
        "old": old,
        "new": new,
        "tests": tests,
        "result": "caught" if p.returncode != 0 else "survived",
        **({"equivalent": EQUIVALENT[name]} if p.returncode == 0 and name in EQUIVALENT else {}),
        "failed": tail,
        "seconds": round(time.time() - t0, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "mutations.json"))
    ap.add_argument("--only", default=None, help="run the mutations whose name contains this text")
    a = ap.parse_args()
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    rows = []
    for m in MUTATIONS:
        if a.only and a.only not in m[0]:
            continue
        rows.append(run_one(m, env))
        print(f"{rows[-1]['result']:>11}  {m[0]}", flush=True)
    applied = [r for r in rows if r["result"] != "not applied"]
    caught = sum(r["result"] == "caught" for r in applied)
    equivalent = [r["name"] for r in applied if "equivalent" in r]
    out = {
        "script": "bench/mutations.py",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "cpu": _cpu_model(),
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "versions": {"masc_engine": _version()},
        },
        "mutations": len(rows),
        "applied": len(applied),
        "caught": caught,
        "caught_fraction": round(caught / max(1, len(applied)), 3),
        "survivors_equivalent": equivalent,
        "survivors_unexplained": [r["name"] for r in applied if r["result"] == "survived" and "equivalent" not in r],
        "rows": rows,
    }
    print(f"{caught} of {len(applied)} applied mutations caught; equivalent survivors: {len(equivalent)}")
    if not a.only:
        Path(a.out).write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
