"""The export-validation budgets come from distributions over initialisations, hold on
initialisations that were not measured, and still refuse a wrong graph.

bench/tolerance_distributions.py measured the validation errors of random initialisations per
shape (default and trained-like scales; bench/results/tolerance_distributions*.json), and for each
the figures of the same graphs against the checkpoint with one weight perturbed. Every measured
initialisation must pass its budget with the stated margin (tolerances.VALIDATION_BUDGET_MARGIN),
no budget may drift far above what it covers, and every perturbed checkpoint must be refused far
above its budget. The slow tests export initialisations of other seeds (not in the measurement),
in both families, and expect no refusal, then the same graphs against the perturbed checkpoint and
expect a refusal.
"""

from __future__ import annotations

import importlib.util
import json
import re

import pytest

from support import REPO
from masc_engine import tolerances as tol
from masc_engine.errors import ExportValidationError

RESULTS = REPO / "bench" / "results"
OLD = "tolerance_distributions.json"  # relative errors only (before the float64 references)
EMBEDDERS_TINY = "tolerance_distributions_embedders_tiny.json"
EMBEDDERS_REAL = "tolerance_distributions_embedders.json"
#: Per measured shape: its budget table and the table's key, its results files (with the checks
#: each is read for; None: every check), and the fewest initialisations of the full measurement
#: (the real shapes ran for as long as the 2 shared cores allowed, see tolerances.py).
SHAPES = {
    "tiny-naflex": (tol.EXPORT_VALIDATION_RTOL_BUDGETS, "tiny", [(OLD, None)], 10),
    "base-naflex": (
        tol.EXPORT_VALIDATION_RTOL_BUDGETS,
        "base",
        [("tolerance_distributions_base-naflex.json", None)],
        10,
    ),
    "so400m-naflex": (
        tol.EXPORT_VALIDATION_RTOL_BUDGETS,
        "so400m",
        [("tolerance_distributions_so400m-naflex.json", None)],
        10,
    ),
    "clipseg-tiny": (
        tol.SEGMENTER_VALIDATION_BUDGETS,
        "clipseg-tiny",
        [(OLD, ("vision", "text")), ("tolerance_distributions_clipseg-tiny.json", None)],
        10,
    ),
    "clipseg-tiny-3": (
        tol.SEGMENTER_VALIDATION_BUDGETS,
        "clipseg-tiny",
        [(OLD, ("vision", "text")), ("tolerance_distributions_clipseg-tiny.json", None)],
        10,
    ),
    "clipseg-rd64": (
        tol.SEGMENTER_VALIDATION_BUDGETS,
        "clipseg-rd64",
        [("tolerance_distributions_clipseg-rd64.json", None)],
        10,
    ),
    # the embedders: the tiny test presets and the real shapes (CLIP B/32, DINO S/16)
    "clip-tiny": (tol.EMBEDDER_VALIDATION_BUDGETS, "clip-tiny", [(EMBEDDERS_TINY, None)], 10),
    "dino-tiny-s16": (tol.EMBEDDER_VALIDATION_BUDGETS, "dino-tiny", [(EMBEDDERS_TINY, None)], 10),
    "dino-tiny-s8": (tol.EMBEDDER_VALIDATION_BUDGETS, "dino-tiny", [(EMBEDDERS_TINY, None)], 10),
    "dinov2-tiny": (tol.EMBEDDER_VALIDATION_BUDGETS, "dinov2-tiny", [(EMBEDDERS_TINY, None)], 10),
    "clip-b32": (tol.EMBEDDER_VALIDATION_BUDGETS, "clip-b32", [(EMBEDDERS_REAL, None)], 10),
    "dino-s16": (tol.EMBEDDER_VALIDATION_BUDGETS, "dino-s16", [(EMBEDDERS_REAL, None)], 10),
}
#: Shapes where one weight perturbed is a wrong graph to the validation only at the default scale:
#: at clipseg-rd64 the FiLM bias off by 0.5 moves the logits by 39 .. 208 times float32's own error
#: (default draws), refused but near the budget, and on trained-like draws by 1 .. 6 times
#: float32's own error (tolerances.py SEGMENTER_NOISE_FACTORS).
WITHIN_FLOAT32 = {"clipseg-rd64"}
#: The clipseg-tiny-3-shaped checkpoint refused before these budgets (relative error; tolerances.py
#: SEGMENTER_VALIDATION_BUDGETS): the floors of the decoder and end to end cover it.
ONCE_REFUSED = {"decoder": 6.02e-6, "end_to_end": 1.55e-5}
#: A wrong graph (one weight perturbed) must give at least this many times its budget, on every check.
MIN_SEPARATION = 10
#: Where a family's wrong graph is refused by its most separated check only (tolerances.py): at
#: clipseg-tiny, trained-like draws (logits in the thousands, each budget 6x the checkpoint's own
#: float32 error) put the FiLM bias off by 0.5 at 7.7x .. 61x the decoder's budget over 5
#: initialisations while end to end can be within it (0.3x at seed 109). Held to this many times the
#: budget on the most separated check; the least measured, 7.7x, leaves a margin of 1.5.
REFUSED_BY_ONE_CHECK = {("clipseg-tiny", "trained-like"): 5}
#: The same on the unseen draws, measured on whatever CPU runs the tests: the segmenter's budget is
#: a multiple of transformers' own float32 error there, and that error depends on the CPU's kernels.
#: On the ill-conditioned clipseg-tiny seed 9002 (trained-like) the refusal was 12x the decoder's
#: budget on a 2-core AMD EPYC (AVX2) and 8.5x on an Intel Xeon with AMX (AVX-512); 5 leaves the
#: second a margin of 1.7.
UNSEEN_MIN_SEPARATION = 5


def _runs(shape: str, full_only: bool = False) -> list[dict]:
    """The shape's runs over its results files, each with only the checks read from its file."""
    out = []
    for name, checks in SHAPES[shape][2]:
        if full_only and checks is not None:
            continue
        for r in json.loads((RESULTS / name).read_text())["runs"]:
            if r["shape"] == shape:
                keep = checks or tuple(r["checks"])
                out.append(
                    {
                        **r,
                        "checks": {c: f for c, f in r["checks"].items() if c in keep},
                        "perturbed": {c: f for c, f in r.get("perturbed", {}).items() if c in keep},
                    }
                )
    return out


def budget_of(shape: str, check: str, figures: dict) -> float:
    """The budget a run's check is held to by today's tolerances: the per-shape constant, or for the
    segmenter's decoder and end to end the larger of it and SEGMENTER_NOISE_FACTOR x the run's
    float32 error (export/segmenter_validate.py ``_check``)."""
    table, key = SHAPES[shape][:2]
    budget = table[key][check]
    if "noise_rel" in figures:
        factor = tol.segmenter_noise_factor(table[key]["width"])[0]
        budget = max(budget, factor * max(figures["noise_rel"], tol.FLOAT32_EPS))
    return budget


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_every_shape_was_measured_over_initialisations_of_both_scales(shape):
    runs = _runs(shape, full_only=True)
    assert len({r["seed"] for r in runs}) >= SHAPES[shape][3], shape
    assert {r["family"] for r in runs} == {"default", "trained-like"}, shape


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_every_measured_initialisation_passes_with_the_margin(shape):
    """margin x each run's figure <= the budget it is held to, for every run of both families."""
    for r in _runs(shape):
        for check, f in r["checks"].items():
            budget = budget_of(shape, check, f)
            assert f["max_rel"] * tol.VALIDATION_BUDGET_MARGIN <= budget, (shape, r["seed"], r["family"], check)


def test_budgets_do_not_drift_far_above_what_they_cover():
    """Each per-shape constant from margin to 10 x margin x the largest figure it covers (the floor of the
    decoder and end to end: of the default family and of the checkpoint once refused, which it
    holds); the noise factor within 10 x margin x the largest error / float32-error ratio measured."""
    worst: dict = {(id(tol.SEGMENTER_VALIDATION_BUDGETS), "clipseg-tiny", c): v for c, v in ONCE_REFUSED.items()}
    ratios: dict = {}
    for shape in SHAPES:
        key = SHAPES[shape][:2]
        for r in _runs(shape):
            for check, f in r["checks"].items():
                if "noise_rel" in f:
                    ratios.setdefault(key[1], []).append(f["max_rel"] / max(f["noise_rel"], tol.FLOAT32_EPS))
                    if r["family"] != "default":
                        continue
                k = (id(key[0]), key[1], check)
                worst[k] = max(worst.get(k, 0.0), f["max_rel"])
    tables = {id(t): t for t, _, _, _ in SHAPES.values()}
    for (tid, key, check), w in worst.items():
        assert w * tol.VALIDATION_BUDGET_MARGIN <= tables[tid][key][check] <= w * tol.VALIDATION_BUDGET_MARGIN * 10, (
            key,
            check,
            w,
        )
    assert set(ratios) == set(tol.SEGMENTER_NOISE_FACTORS)
    for key, r in ratios.items():
        assert max(r) * tol.VALIDATION_BUDGET_MARGIN <= tol.SEGMENTER_NOISE_FACTORS[key] <= max(r) * 30, key


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_a_perturbed_weight_stays_far_above_the_budget(shape):
    """Over every measured initialisation with a perturbed-weight record: the wrong graph's figure
    >= MIN_SEPARATION x the budget it is held to (its own float32 error counted) on every check, or,
    for a family in REFUSED_BY_ONE_CHECK, its most separated check >= that many times its budget."""
    if shape in WITHIN_FLOAT32:
        pytest.skip("the perturbation is within float32's own error at this shape (tolerances.py)")
    seen = 0
    for r in _runs(shape):
        times = {c: f["max_rel"] / budget_of(shape, c, f) for c, f in r.get("perturbed", {}).items()}
        seen += len(times)
        if not times:
            continue
        least = REFUSED_BY_ONE_CHECK.get((shape, r["family"]))
        if least is None:
            assert min(times.values()) >= MIN_SEPARATION, (shape, r["seed"], times)
        else:
            assert max(times.values()) >= least, (shape, r["seed"], times)
    if shape.startswith("clipseg"):
        assert seen >= 2 * SHAPES[shape][3]  # decoder and end to end of every run
    elif SHAPES[shape][0] is tol.EMBEDDER_VALIDATION_BUDGETS:
        assert seen >= SHAPES[shape][3]  # each graph of every run


@pytest.mark.parametrize("shape", sorted(WITHIN_FLOAT32))
def test_a_perturbed_weight_is_refused_on_every_default_draw(shape):
    """Where the perturbation is weak (WITHIN_FLOAT32): on every default-family initialisation some
    check of the wrong graph is past the budget it is held to, so its export is refused."""
    runs = [r for r in _runs(shape) if r["family"] == "default"]
    assert len(runs) >= SHAPES[shape][3] // 2
    for r in runs:
        figures = r["perturbed"]
        assert any(f["max_rel"] > budget_of(shape, c, f) for c, f in figures.items()), (shape, r["seed"], figures)


def _bench():
    spec = importlib.util.spec_from_file_location(
        "tolerance_distributions", REPO / "bench" / "tolerance_distributions.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


#: Initialisations no measurement used (they use seeds FIRST_SEED ..), per tiny preset (SigLIP2,
#: the segmenter's, the embedders') two, one of each family (clipseg-tiny-3: a checkpoint of this
#: shape was once refused).
UNSEEN = [
    ("tiny-naflex", 9001, "default"),
    ("tiny-naflex", 9002, "trained-like"),
    ("clipseg-tiny", 9001, "default"),
    ("clipseg-tiny", 9002, "trained-like"),
    ("clipseg-tiny-3", 9001, "default"),
    ("clipseg-tiny-3", 9002, "trained-like"),
    ("clip-tiny", 9001, "default"),
    ("clip-tiny", 9002, "trained-like"),
    ("dino-tiny-s16", 9001, "default"),
    ("dino-tiny-s16", 9002, "trained-like"),
    ("dino-tiny-s8", 9001, "default"),
    ("dino-tiny-s8", 9002, "trained-like"),
    ("dinov2-tiny", 9001, "default"),
    ("dinov2-tiny", 9002, "trained-like"),
]


def test_every_tiny_preset_has_unseen_initialisations_of_both_families():
    """At least two held-out initialisations per tiny preset, one of each family, none measured."""
    by_shape: dict = {}
    for shape, seed, family in UNSEEN:
        by_shape.setdefault(shape, set()).add((seed, family))
    assert set(by_shape) == {s for s in SHAPES if "tiny" in s}
    for shape, draws in by_shape.items():
        assert len(draws) >= 2 and {f for _, f in draws} == {"default", "trained-like"}, shape
        assert all(seed >= 9001 for seed, _ in draws), shape


@pytest.mark.slow
@pytest.mark.parametrize("shape, seed, family", UNSEEN)
def test_unseen_initialisations_export_and_a_perturbed_weight_is_refused(shape, seed, family, tmp_path):
    pytest.importorskip("torch", reason="exporting needs the export extra (torch)")
    bench = _bench()
    for f in {name for s in SHAPES.values() for name, _ in s[2]}:
        assert seed not in json.loads((RESULTS / f).read_text())["seeds"]
    ckpt = bench.build(shape, seed, family, tmp_path)
    out = tmp_path / "bundle"
    bench.export(shape, ckpt, out)  # no override: a refusal raises here
    if shape.startswith("clipseg"):
        checks = {"decoder", "end_to_end"}
    elif shape.startswith(("clip", "dino")):
        checks = {"image", "text"} if shape.startswith("clip") else {"image"}
    else:
        checks = {"vision", "pool", "text"}
    v = json.loads((out / "manifest.json").read_text())["validation"]
    assert not [c for c, r in v.items() if isinstance(r, dict) and "override" in r]
    # the same graphs against the checkpoint with one weight perturbed: every check past its budget
    wrong = bench.perturbed(shape, ckpt, out)
    assert set(wrong) == checks
    # every check refuses it; the refusal (the check farthest past its budget) by >= UNSEEN_MIN_SEPARATION.
    # End to end alone can be nearer: on an ill-conditioned checkpoint (clipseg-tiny seed 9002,
    # trained-like: float32 error 1.2e-4 relative) it refuses at 2x its budget, float32 allowing no more.
    assert all(f["past_budget"] and f["max_rel"] > f["rtol"] for f in wrong.values()), wrong
    assert max(f["max_rel"] / f["rtol"] for f in wrong.values()) >= UNSEEN_MIN_SEPARATION, wrong
    print({c: round(f["max_rel"] / f["rtol"], 1) for c, f in wrong.items()})  # the separations, with -s
    with pytest.raises(ExportValidationError, match="differs from"):
        bench.perturbed(shape, ckpt, out, accept=None)


# ------------------------------------------------------------------ the run-time gates

#: bench/gate_distributions.py results: (shape, NaFlex budget recorded, initialisations) per file.
#: base/256: bf16-cpu and int8 (fp16 in its own file below); so400m/256: the same; tiny (the tests' shape, default budget): all three; the embedders (bf16-cpu only): 10 of each tiny shape and of B/32 and S/16.
GATE_FILES = {
    "gate_distributions_base256.json": ("base-naflex", 256, 10),
    "gate_distributions_so400m256.json": ("so400m-naflex", 256, 10),
    "gate_distributions_tiny.json": ("tiny-naflex", None, 10),
    "gate_distributions_clip_tiny.json": ("clip-tiny", None, 10),
    "gate_distributions_dino_tiny_s16.json": ("dino-tiny-s16", None, 10),
    "gate_distributions_dinov2_tiny.json": ("dinov2-tiny", None, 10),
    "gate_distributions_clip_b32.json": ("clip-b32", None, 10),
    "gate_distributions_dino_s16.json": ("dino-s16", None, 10),
}


def _passes_fidelity(f: dict) -> bool:
    return (
        max(f["max_abs_dcp"], f["max_abs_dpf"]) <= tol.FIDELITY_MAX_ABS_DELTA
        and min(f["spearman_cp"], f["spearman_pf"]) >= tol.FIDELITY_MIN_SPEARMAN
    )


@pytest.mark.parametrize("name", GATE_FILES)
def test_the_run_time_gates_were_measured_over_initialisations_of_both_scales(name):
    """bench/gate_distributions.py: the initialisations GATE_FILES names, both families, each with its bf16-cpu
    certification and int8 gate figures recorded."""
    res = json.loads((RESULTS / name).read_text())
    shape, budget, n = GATE_FILES[name]
    assert (res["shape"], res["budget"]) == (shape, budget)
    runs = res["runs"]
    assert len({r["seed"] for r in runs}) >= n and {r["family"] for r in runs} == {"default", "trained-like"}
    assert res["summary"]["all"]["bf16_cpu_certified"] == sum(r["bf16_cpu"]["certified"] for r in runs)


@pytest.mark.parametrize("name", GATE_FILES)
def test_each_recorded_outcome_follows_from_todays_gates(name):
    """A certified bundle's held-out figures pass today's bf16-cpu gates (and its pairs are enough);
    a refused one's whole graph fails them; an int8 bundle was kept exactly when its figures pass
    today's int8 gates; an fp16 export (where measured) exactly when its pair gates pass. A gate's
    value changed without a new measurement fails here."""
    for r in json.loads((RESULTS / name).read_text())["runs"]:
        b, i = r["bf16_cpu"], r.get("int8")
        if b["certified"]:
            assert _passes_fidelity(b["heldout"]) and b["heldout"]["pairs"] >= tol.FIDELITY_MIN_PAIRS, r["seed"]
        else:
            assert not _passes_fidelity(_refused_figures(b)), r["seed"]
        if i is None:  # an embedder: bf16-cpu is its only reduced precision
            continue
        passes = (
            i["max_abs_dcp"] <= tol.INT8_MAX_ABS_DCP
            and min(i["spearman_cp"], i["spearman_pf"]) >= tol.INT8_MIN_SPEARMAN
        )
        assert i["kept"] == passes, (r["seed"], i)
        if "fp16" in r:
            _check_fp16(r)


def _refused_figures(b: dict) -> dict:
    """The figures a refusal stopped on: the whole graph's on calibration when they fail, else the
    held-out figures of the last plan tried (read from the refusal's one line: a plan can pass the
    calibration pairs and fail the held-out ones)."""
    if not _passes_fidelity(b["whole_graph"]):
        return b["whole_graph"]
    m = re.search(
        r"held-out FAIL \(max \|dCP\| (\S+) .*?max \|dPF\| (\S+) .*?Spearman CP (\S+) .*?/ PF (\S+) ", b["refusal"]
    )
    assert m, b["refusal"]
    return dict(zip(("max_abs_dcp", "max_abs_dpf", "spearman_cp", "spearman_pf"), map(float, m.groups())))


def _check_fp16(r: dict) -> None:
    f = r["fp16"]
    if "max_abs_dcp" not in f:  # refused by a graph's own fp16 gate, before the pair gates
        m = re.search(
            r"graph '(\w+)' fails its gates against PyTorch fp32: cosine cos_min ([\d.]+)", f.get("refusal", "")
        )
        assert not f["kept"] and m and float(m.group(2)) < tol.FIDELITY_MIN_EMBEDDING_COSINE, (r["seed"], f)
        return
    passes = max(f["max_abs_dcp"], f["max_abs_dpf"]) <= tol.FIDELITY_MAX_ABS_DELTA and f["finite_where_fp32_finite"]
    assert f["kept"] == passes, (r["seed"], f)


#: bench/gate_distributions.py --gates fp16 at a NaFlex budget of 256: (shape, initialisations) per file.
FP16_GATE_FILES = {
    "gate_distributions_base256_fp16.json": ("base-naflex", 10),
    "gate_distributions_so400m256_fp16.json": ("so400m-naflex", 10),
}


@pytest.mark.parametrize("name", FP16_GATE_FILES)
def test_the_fp16_export_gates_were_measured_over_initialisations_and_follow_from_todays_gates(name):
    """bench/gate_distributions.py --gates fp16: the initialisations FP16_GATE_FILES names, of both
    families; each fp16 export kept exactly when its pair gates' figures pass today's gate."""
    res = json.loads((RESULTS / name).read_text())
    runs = res["runs"]
    shape, n = FP16_GATE_FILES[name]
    assert (res["shape"], res["budget"], res["gates"]) == (shape, 256, "fp16")
    assert len({r["seed"] for r in runs}) >= n and {r["family"] for r in runs} == {"default", "trained-like"}
    for r in runs:
        _check_fp16(r)


#: bench/gate_distributions.py --gates fp16 on the segmenter shapes: (shape, initialisations).
SEGMENTER_FP16_FILES = {
    "gate_distributions_clipseg_tiny_fp16.json": ("clipseg-tiny", 10),
    "gate_distributions_clipseg_tiny_3_fp16.json": ("clipseg-tiny-3", 10),
    "gate_distributions_clipseg_rd64_fp16.json": ("clipseg-rd64", 10),
}


@pytest.mark.parametrize("name", SEGMENTER_FP16_FILES)
def test_the_segmenter_fp16_gates_were_measured_over_initialisations_and_follow_from_todays_gates(name):
    """bench/gate_distributions.py --gates fp16 on a CLIPSeg shape: 10 initialisations of both
    families, the masks' IoU measured on every one (a per-graph refusal recorded, not stopping the
    bench); each export kept exactly when no per-graph gate refused it and its masks pass today's
    IoU gate. The gate's value changed without a new measurement fails here."""
    res = json.loads((RESULTS / name).read_text())
    shape, n = SEGMENTER_FP16_FILES[name]
    assert (res["shape"], res["gates"]) == (shape, "fp16")
    runs = res["runs"]
    assert len({r["seed"] for r in runs}) >= n and {r["family"] for r in runs} == {"default", "trained-like"}
    for r in runs:
        f = r["fp16"]
        assert f["masks_pass"] == (f["min_iou"] >= tol.SEGMENTER_REDUCED_MIN_MASK_IOU), (r["seed"], f)
        assert f["kept"] == (f["masks_pass"] and not f["graph_gates_refused"]), (r["seed"], f)
        for g in f["graph_gates_refused"]:  # the decoder's and text's rule: every row's cosine
            assert g["rule"] == "embedding" and g["cos_min"] < tol.FIDELITY_MIN_EMBEDDING_COSINE, (r["seed"], g)
        assert f["cases"] >= 4 and f["min_iou"] <= f["median_iou"] <= 1.0
