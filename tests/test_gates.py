"""The gates that certify a reduced-precision bundle, plan an export's memory and guard decoding,
each checked on the side a wrong rule would let through.

- bf16-cpu certification (export/cpu_precision.py): the score gates with deltas of both signs, the
  held-out set gating on its own, the default number of units kept in fp32;
- int8 (jobs/int8_gate.py): the same gates with both signs;
- OpenVINO's f32 runtime check: a node computing in f32 with a bf16 output is not f32;
- the export memory plan (export/stages.py): per precision, per stage, under a cgroup limit, and
  the sampled peak including the process's lifetime peak (VmHWM);
- Scorer(fg_threshold=0.0) scores at 0.0; a segmenter's work is added to a file's decoded-bytes
  reservation; Pillow's DecompressionBombWarning is a refusal.
"""

from __future__ import annotations

import io
import math
from contextlib import contextmanager
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image

from masc_engine import tolerances as tol
from masc_engine.errors import BackendUnavailableError, InputError
from masc_engine.export import cpu_precision as cpp
from masc_engine.export import stages

# --------------------------------------------------------------------------- bf16-cpu score gates


def _ref_scores(n: int = 1200, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {"cp": rng.uniform(0.3, 0.95, n), "pf": rng.uniform(0.0, 0.2, n)}


def _shift(ref: dict, d_cp: float = 0.0, d_pf: float = 0.0) -> dict:
    return {"cp": ref["cp"] + d_cp, "pf": ref["pf"] + d_pf}


@pytest.mark.parametrize("sign", [-1.0, 1.0])
@pytest.mark.parametrize("score", ["cp", "pf"])
def test_bf16_gate_refuses_a_shift_of_either_sign(sign, score):
    """A bundle 0.05 below fp32 fails as one 0.05 above does (the gate is on |delta|)."""
    ref = _ref_scores()
    test = _shift(ref, **{f"d_{score}": sign * 0.05})
    f = cpp.gate_figures(ref, test)
    gate = f["gates"][f"max_abs_d{score}"]
    assert not f["pass"] and not gate["pass"]
    assert gate["value"] == pytest.approx(0.05, rel=tol.FLOAT64_SAME_FORMULA_TOL)
    # a shift inside the gate passes, whatever its sign
    small = _shift(ref, **{f"d_{score}": sign * tol.FIDELITY_MAX_ABS_DELTA / 2})
    assert cpp.gate_figures(ref, small)["pass"]


def _spearman_just_at(ref: dict, lo: float, hi: float) -> dict:
    """A candidate whose CP Spearman against ``ref`` lies in ``[lo, hi)``, every |dCP| inside the
    delta gate: the reference plus clipped noise, its scale found by bisection."""
    noise = np.clip(np.random.default_rng(5).normal(size=ref["cp"].shape), -1, 1) * tol.FIDELITY_MAX_ABS_DELTA * 0.95
    a, b = 0.0, 1.0
    for _ in range(60):
        s = (a + b) / 2
        rho = cpp.spearman(ref["cp"], ref["cp"] + s * noise)
        if lo <= rho < hi:
            return {"cp": ref["cp"] + s * noise, "pf": ref["pf"]}
        a, b = (s, b) if rho >= hi else (a, s)
    raise AssertionError("no noise scale gives that Spearman")


def test_bf16_spearman_gate_at_its_edge():
    """A Spearman a hair above the gate passes, a hair below fails (the gate is >=, not a
    stricter or looser bound)."""
    ref = _ref_scores(3000, 4)
    ref["cp"] = 0.8 + ref["cp"] / 20  # a narrow CP range (same-subject pairs): ranks move within the delta gate
    g = tol.FIDELITY_MIN_SPEARMAN
    above = cpp.gate_figures(ref, _spearman_just_at(ref, g, g + (1 - g) * 0.02))
    below = cpp.gate_figures(ref, _spearman_just_at(ref, g - (1 - g) * 0.02, g))
    assert above["gates"]["max_abs_dcp"]["pass"] and below["gates"]["max_abs_dcp"]["pass"]
    assert above["pass"] and above["gates"]["spearman_cp"]["value"] >= g
    assert not below["pass"] and not below["gates"]["spearman_cp"]["pass"]


def test_bf16_gate_refuses_one_pair_below_fp32():
    ref = _ref_scores()
    test = {"cp": ref["cp"].copy(), "pf": ref["pf"].copy()}
    test["cp"][7] -= 0.05  # one pair only: Spearman barely moves
    f = cpp.gate_figures(ref, test)
    assert f["gates"]["spearman_cp"]["pass"] and not f["gates"]["max_abs_dcp"]["pass"] and not f["pass"]


class FakeEvaluator:
    """Stands for :class:`cpu_precision.Evaluator`: 6 units; the candidate's scores are the
    reference's moved by ``delta(kept, set)`` (a plan's error as the number of fp32 units grows)."""

    def __init__(self, delta):
        self.unit_names = ["vision.embeddings"] + [f"vision.layers.{i}" for i in range(4)] + ["vision.head"]
        self.delta, self.log, self.calls = delta, (lambda _m: None), []
        self.calibration, self.heldout = _ref_scores(200, 1), _ref_scores(tol.FIDELITY_MIN_PAIRS, 2)

    def figures(self, keep, pairs, min_pairs: int = 0) -> dict:
        which = "heldout" if pairs is self.heldout else "calibration"
        self.calls.append((which, tuple(keep)))
        sign = -1.0 if len(keep) % 2 else 1.0  # errors below fp32 too
        return cpp.gate_figures(pairs, _shift(pairs, d_cp=sign * self.delta(len(keep), which)), min_pairs)


def _search(delta, **kw):
    ev = FakeEvaluator(delta)
    return ev, cpp.search_keep_list(ev, ev.calibration, ev.heldout, **kw)


def test_a_failing_heldout_set_refuses_certification():
    """Calibration passes with the whole graph in bf16; held-out |dCP| 0.0103 (5x the gate) at
    every plan: refused, never certified on calibration alone."""
    ev = FakeEvaluator(lambda k, which: 0.0 if which == "calibration" else 0.0103)
    with pytest.raises(cpp.CertificationError) as e:
        cpp.search_keep_list(ev, ev.calibration, ev.heldout)
    assert "held-out FAIL" in str(e.value) and "\n" not in str(e.value)
    assert ("heldout", ()) in ev.calls


def test_the_heldout_set_adds_units_calibration_did_not_need():
    ev, found = _search(lambda k, which: 0.0 if which == "calibration" else (0.0103 if k < 2 else 1e-4))
    assert len(found["keep_fp32"]) == 2 and found["heldout"]["pass"]
    assert found["heldout"]["pairs"] == tol.FIDELITY_MIN_PAIRS


def test_default_max_keep_is_half_the_units():
    """6 units: 3 in fp32 may be certified, 4 may not (bf16 would then buy little)."""
    ev, found = _search(lambda k, which: 0.05 if k < 3 else 1e-4)
    assert len(found["keep_fp32"]) == 3
    with pytest.raises(cpp.CertificationError, match="at most 3 of 6 units"):
        _search(lambda k, which: 0.05 if k < 4 else 1e-4)
    ev, found = _search(lambda k, which: 0.05 if k < 4 else 1e-4, max_keep=4)
    assert len(found["keep_fp32"]) == 4


def test_a_heldout_set_below_the_pair_count_does_not_count():
    ref = _ref_scores(tol.FIDELITY_MIN_PAIRS - 1)
    f = cpp.gate_figures(ref, ref, tol.FIDELITY_MIN_PAIRS)
    assert not f["pass"] and not f["gates"]["min_pairs"]["pass"]


# --------------------------------------------------------------------------- int8 gate


@pytest.mark.parametrize("sign", [-1.0, 1.0])
def test_int8_gate_refuses_a_shift_of_either_sign(sign):
    pytest.importorskip("scipy")
    from masc_engine.jobs.int8_gate import gate_report

    ref = _ref_scores()
    bad = gate_report(ref["cp"], ref["pf"], ref["cp"] + sign * 0.05, ref["pf"])
    assert not bad["passed"] and bad["max_abs_dcp"] == pytest.approx(0.05, rel=tol.FLOAT64_SAME_FORMULA_TOL)
    ok = gate_report(ref["cp"], ref["pf"], ref["cp"] + sign * tol.INT8_MAX_ABS_DCP / 2, ref["pf"])
    assert ok["passed"]


# --------------------------------------------------------------------------- OpenVINO f32 check


def test_openvino_f32_check_refuses_a_bf16_output_of_an_f32_node():
    from masc_engine.engine.backends import openvino as ovb

    mixed = {"type": "FullyConnected", "precision": "f32", "outputs": "bf16", "names": "fc"}
    with pytest.raises(BackendUnavailableError, match="bf16 although f32"):
        ovb.check_runtime_precision([mixed], "f32", "g")
    computes = {"type": "FullyConnected", "precision": "bf16", "outputs": "f32", "names": "fc"}
    with pytest.raises(BackendUnavailableError, match="bf16 although f32"):
        ovb.check_runtime_precision([computes], "f32", "g")


# --------------------------------------------------------------------------- export memory plan

SO400M = {"vision": 1_713_000_000, "pool": 60_000_000, "text": 1_641_000_000}  # random:so400m-naflex


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_reduced_precision_plans_the_converter_stage(precision):
    """bf16 and fp16 exports run the converter (peak 10.2 GB at so400m): --max-memory-gb 6 refuses
    them, while the fp32 plan (5.1 GB, torch stage) fits."""
    fp32 = stages.plan_memory(SO400M, "fp32")
    reduced = stages.plan_memory(SO400M, precision)
    assert set(reduced.stages) == {"torch", "validate", "fuse", "precision", "pairs"}
    assert reduced.peak == ("precision", int(0.8e9 + 5.5 * SO400M["vision"]))
    assert stages.check_memory_plan(fp32, 6, "m").startswith("memory plan: peak about 5.1 GB in the torch stage")
    with pytest.raises(stages.ExportMemoryError, match=r"about 10\.2 GB at its peak \(precision stage"):
        stages.check_memory_plan(reduced, 6, "m")


def test_the_peak_stage_is_the_largest_estimate_not_the_last_name():
    plan = stages.plan_memory(SO400M, "fp32")
    assert plan.peak == ("torch", int(1e9 + 1.2 * sum(SO400M.values())))
    assert plan.peak[1] == max(plan.stages.values()) > plan.stages["validate"]
    assert stages.MemoryPlan({"validate": 1, "torch": 3, "fuse": 2}, {}).peak == ("torch", 3)


def _memory_files(tmp_path, meminfo_kb: int, cgroup: str | None):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(f"MemTotal:       {meminfo_kb} kB\nMemFree:        1000 kB\n")
    files = []
    if cgroup is not None:
        (tmp_path / "memory.max").write_text(cgroup + "\n")
        files.append(str(tmp_path / "memory.max"))
    return str(meminfo), tuple(files) + (str(tmp_path / "absent"),)


@pytest.mark.parametrize(
    "cgroup, want",
    [
        ("4000000000", 4_000_000_000),
        ("max", 16_000_000 * 1024),
        (str(1 << 62), 16_000_000 * 1024),
        (None, 16_000_000 * 1024),
        ("99000000000", 16_000_000 * 1024),
    ],
)
def test_machine_memory_is_the_smaller_of_ram_and_the_cgroup_limit(tmp_path, cgroup, want):
    meminfo, cgroups = _memory_files(tmp_path, 16_000_000, cgroup)
    assert stages.machine_memory_bytes(meminfo, cgroups) == want


def test_a_cgroup_without_ram_figure_is_the_limit_and_max_is_none(tmp_path):
    absent = str(tmp_path / "no-meminfo")
    _, cgroups = _memory_files(tmp_path, 1, "4000000000")
    assert stages.machine_memory_bytes(absent, cgroups) == 4_000_000_000
    for unlimited in ("max", str(1 << 62)):
        _, cgroups = _memory_files(tmp_path, 1, unlimited)
        assert stages.machine_memory_bytes(absent, cgroups) is None


def test_a_plan_past_the_cgroup_limit_is_refused(tmp_path, monkeypatch):
    meminfo, cgroups = _memory_files(tmp_path, 64_000_000, "4000000000")
    real = stages.machine_memory_bytes
    monkeypatch.setattr(stages, "machine_memory_bytes", lambda: real(meminfo, cgroups))
    with pytest.raises(stages.ExportMemoryError, match=r"more than this machine's memory \(4\.0 GB\)"):
        stages.check_memory_plan(stages.plan_memory(SO400M, "fp32"), None, "m")


def test_a_stage_peak_includes_the_lifetime_peak_it_raised(monkeypatch):
    """The sampler saw 0.11 GB; VmHWM rose to 0.83 GB during the stage (a C++ call holding the
    GIL): the stage's peak is 0.83 GB. A stage that did not raise VmHWM keeps its sampled peak."""
    s = stages.PeakSampler.__new__(stages.PeakSampler)  # no sampling thread: the figures are set here
    s._lock, s._peak, s._hwm = __import__("threading").Lock(), int(0.11e9), int(0.5e9)
    hwm = [int(0.83e9)]
    monkeypatch.setattr(stages, "_rss_now", lambda: int(0.1e9))
    monkeypatch.setattr(stages, "rss", lambda pid="self": (int(0.1e9), hwm[0]))
    assert s.mark() == int(0.83e9)
    s._peak = int(0.2e9)
    assert s.mark() == int(0.2e9)  # VmHWM unchanged: an earlier stage's peak, not this one's


# --------------------------------------------------------------------------- scorer threshold


def test_fg_threshold_zero_scores_at_zero(naflex_bundle):
    """Every mask weight 0.39: no reference patch passes the default 0.5 threshold (CP undefined);
    at fg_threshold=0.0 every patch does."""
    from masc_engine.export.validate import synthetic_image
    from masc_engine.runtime.scorer import Scorer

    im = synthetic_image(96, 96, 1)
    faint = np.full((96, 96), 100, np.uint8)
    at_zero = Scorer(naflex_bundle, fg_threshold=0.0)
    assert at_zero.fg_threshold == 0.0 and at_zero.config.fg_threshold == 0.0
    assert math.isnan(Scorer(naflex_bundle).score(im, faint, im, faint, "a dog", "dog").cp)
    r = at_zero.score(im, faint, im, faint, "a dog", "dog")
    assert math.isfinite(r.cp) and r.cp == pytest.approx(1.0, abs=tol.SELF_CP_ATOL)


# --------------------------------------------------------------------------- decoding


class _Stop(Exception):
    pass


class _RecordingBudget:
    @contextmanager
    def reserve(self, n: int):
        self.reserved = n
        raise _Stop  # the reservation is what is checked; nothing is decoded
        yield  # pragma: no cover


def _png(w: int, h: int, mode: str = "RGB") -> bytes:
    buf = io.BytesIO()
    Image.new(mode, (w, h)).save(buf, "PNG")
    return buf.getvalue()


def test_a_segmenter_adds_its_work_to_the_decoded_bytes_reservation():
    from masc_engine.jobs import items
    from masc_engine.runtime.io import open_image

    settings = SimpleNamespace(mode="naflex", max_num_patches=256, patch_size=16, image_size=None)
    scorer = SimpleNamespace(image_settings=settings)
    masks = SimpleNamespace(reserve_bytes=lambda size: 187 * 2**20 + size[0])
    data = _png(1200, 800)
    alone = items.reservation(open_image(data), "image", settings)
    budget = _RecordingBudget()
    with pytest.raises(_Stop):
        items.decode_image(data, "x.png", scorer, budget=budget, masks=masks, subjects=("dog",))
    assert budget.reserved == alone + 187 * 2**20 + 1200
    with pytest.raises(_Stop):
        items.decode_image(data, "x.png", scorer, budget=budget, masks=masks, subjects=())
    assert budget.reserved == alone  # no subject to segment: nothing added


def test_decompression_bomb_warning_is_a_refusal(monkeypatch):
    """A pixel budget of 1,000,000 (masc-serve --max-pixels): a 1.5 Mpx file sits between the
    budget and twice it, where Pillow only warns; it is refused all the same."""
    from masc_engine.runtime.io import open_image

    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1_000_000)
    data = _png(1500, 1000, "L")
    with pytest.raises(InputError) as e:
        open_image(data, "big.png")
    assert e.value.reason == "image_too_large" and "big.png" in str(e.value)
    assert open_image(_png(1000, 1000, "L"), "ok.png").size == (1000, 1000)
