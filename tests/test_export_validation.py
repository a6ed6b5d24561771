"""Export validation refuses errors well past its budgets (a check widened 10x or more fails here).

Errors a real export bug gives are far larger (>= 1e-2); these are 10-100x the per-shape budget
(``tolerances.EXPORT_VALIDATION_BUDGETS``): fp16-rounded pooling-head outputs (4.9e-4 measured on
the tiny model, against 2e-5), and a single element off by 10x the budget in each graph's output.
"""

from __future__ import annotations

import numpy as np
import pytest

from support import checkpoint_dir
from masc_engine.engine.backends.onnxruntime import OrtRunner
from masc_engine.errors import ExportValidationError
from masc_engine.export import validate as val
from masc_engine.tolerances import FLOAT32_SAME_ARITHMETIC_ATOL, export_validation_atol

pytest.importorskip("torch", reason="the references come from the PyTorch model")


@pytest.fixture(scope="module")
def references(naflex_bundle):
    from transformers import AutoModel, AutoProcessor

    from masc_engine.engine.manifest import read_manifest

    ckpt = checkpoint_dir(naflex_bundle)
    model = AutoModel.from_pretrained(ckpt, attn_implementation="eager").eval()
    processor = AutoProcessor.from_pretrained(ckpt)
    m = read_manifest(naflex_bundle)
    return val.torch_references(model, processor, m["image"], m["text"], naflex_bundle)


class Altered:
    """A runner whose output ``name`` is changed by ``fn`` (what a wrong graph would return)."""

    def __init__(self, runner, name, fn):
        self.runner, self.name, self.fn = runner, name, fn

    def run(self, feeds):
        out = dict(self.runner.run(feeds))
        out[self.name] = self.fn(out[self.name])
        return out


CHECKS = {
    "vision": (val.check_vision, "last_hidden_state"),
    "pool": (val.check_pool, "pooled"),
    "text": (val.check_text, "text_embeds"),
}


def test_fp16_rounded_pool_outputs_are_refused(naflex_bundle, references):
    runner = OrtRunner(naflex_bundle / "pool.onnx", "pool")
    atol = export_validation_atol("pool", references["width"])[0]
    assert val.check_pool(runner, references["pool"])["max_abs"] <= atol  # the real graph passes
    fp16 = Altered(runner, "pooled", lambda x: x.astype(np.float16).astype(np.float32))
    worst = max(np.abs(fp16.run(c["feeds"])["pooled"] - c["ref"]).max() for c in references["pool"])
    assert 10 * atol <= worst <= 100 * atol, worst  # the error this test is about: 10-100x the budget
    with pytest.raises(ExportValidationError, match="graph 'pool' differs from PyTorch") as e:
        val.check_pool(fp16, references["pool"])
    assert e.value.report["max_abs"] == pytest.approx(worst) and e.value.report["atol"] == atol


@pytest.mark.parametrize("graph", ["vision", "pool", "text"])
def test_one_element_off_by_ten_budgets_is_refused(graph, naflex_bundle, references):
    check, output = CHECKS[graph]
    runner = OrtRunner(naflex_bundle / f"{graph}.onnx", graph)
    atol = export_validation_atol(graph, references["width"])[0]

    def bump(x):
        x = x.copy()
        x.reshape(-1)[0] += 10 * atol
        return x

    assert check(runner, references[graph])["max_abs"] <= atol
    with pytest.raises(ExportValidationError, match=f"graph '{graph}' differs from PyTorch"):
        check(Altered(runner, output, bump), references[graph])


# --------------------------------------------------------------------------- segmenter: the noise floor


def _seg_cases(max_rel: float, noise_rel: float | None) -> list[dict]:
    cases = [
        {"max_abs": max_rel * 100, "max_rel": max_rel, "shape": [1, 352, 352]},
        {"max_abs": max_rel * 50, "max_rel": max_rel / 2, "shape": [3, 352, 352]},
    ]
    if noise_rel is not None:
        cases[0]["noise_rel"], cases[1]["noise_rel"] = noise_rel / 4, noise_rel
    return cases


@pytest.mark.parametrize("check", ["decoder", "end_to_end"])
def test_an_ill_conditioned_segmenter_is_held_to_its_own_float32_error(check):
    """Logits in the thousands: transformers' own float32 error is 1e-4 relative; the budget is
    SEGMENTER_NOISE_FACTOR x that, not the floor, and a figure past it is still refused."""
    from masc_engine import tolerances as tol
    from masc_engine.export import segmenter_validate as sv

    floor = tol.segmenter_validation_budget(check, 64)[0]
    noise = 1e-4
    assert tol.SEGMENTER_NOISE_FACTOR * noise > 10 * floor  # the case this test is about
    budget = tol.SEGMENTER_NOISE_FACTOR * noise
    report = sv._check(check, _seg_cases(0.9 * budget, noise), 64)
    assert report["rtol"] == budget and report["rtol_floor"] == floor and report["noise_rel"] == noise
    assert report["error_over_noise"] == pytest.approx(0.9 * tol.SEGMENTER_NOISE_FACTOR)
    assert "override" not in report and "SEGMENTER_NOISE_FACTOR" in report["budget_from"]
    with pytest.raises(
        ExportValidationError,
        match=r"SEGMENTER_NOISE_FACTORS\['clipseg-tiny'\] 6 x transformers' own float32 relative error",
    ) as e:
        sv._check(check, _seg_cases(1.1 * budget, noise), 64)
    assert e.value.report["max_rel"] == 1.1 * budget


def test_the_noise_factor_is_the_shapes():
    """A 768-wide segmenter takes clipseg-rd64's factor, a 64-wide one clipseg-tiny's."""
    from masc_engine import tolerances as tol
    from masc_engine.export import segmenter_validate as sv

    noise = 1e-4
    for width, key in ((64, "clipseg-tiny"), (768, "clipseg-rd64")):
        factor = tol.SEGMENTER_NOISE_FACTORS[key]
        assert sv._check("decoder", _seg_cases(0.99 * factor * noise, noise), width)["rtol"] == factor * noise
        with pytest.raises(ExportValidationError):
            sv._check("decoder", _seg_cases(1.01 * factor * noise, noise), width)
    assert tol.SEGMENTER_NOISE_FACTORS["clipseg-rd64"] != tol.SEGMENTER_NOISE_FACTORS["clipseg-tiny"]


@pytest.mark.parametrize("check", ["decoder", "end_to_end"])
def test_a_well_conditioned_segmenter_keeps_the_floor(check):
    """A float32 error below floor / factor (or none reported, or below float32's epsilon) leaves
    the floor in place: refused just above it."""
    from masc_engine import tolerances as tol
    from masc_engine.export import segmenter_validate as sv

    floor, source = tol.segmenter_validation_budget(check, 64)
    for noise in (floor / tol.SEGMENTER_NOISE_FACTOR / 2, None, 0.0):
        assert sv._check(check, _seg_cases(floor, noise), 64)["rtol"] == floor
        with pytest.raises(ExportValidationError) as e:
            sv._check(check, _seg_cases(floor * 1.01, noise), 64)
        assert e.value.report["budget_from"] == source
    assert sv._check(check, _seg_cases(floor, 0.0), 64)["noise_rel"] == tol.FLOAT32_EPS


def test_the_segmenter_towers_keep_their_own_budgets():
    """vision and text are not held to the noise floor (their spread is narrow): a large reported
    float32 error does not widen them."""
    from masc_engine import tolerances as tol
    from masc_engine.export import segmenter_validate as sv

    for check in ("vision", "text"):
        budget = tol.segmenter_validation_budget(check, 64)[0]
        with pytest.raises(ExportValidationError):
            sv._check(check, _seg_cases(budget * 1.5, 1e-3), 64)


def test_float64_references_leave_the_model_untouched():
    """The float64 pass runs on a copy: the model stays float32 with its exact weights, and the
    float32 error measured is real (> 0) and small (float32 rounding of a 2-layer MLP)."""
    import torch

    from masc_engine.export.segmenter_validate import _float64

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 8)).eval()
    before = [p.detach().clone() for p in m.parameters()]
    x = torch.randn(16, 64)
    with torch.no_grad():
        y32 = m(x)
        m64 = _float64(m)
        assert {p.dtype for p in m64.parameters()} == {torch.float64}
        y64 = m64(x.double())
    assert all(p.dtype == torch.float32 and torch.equal(p, b) for p, b in zip(m.parameters(), before))
    err = float((y32.double() - y64).abs().max() / y64.abs().max())
    assert 0 < err < FLOAT32_SAME_ARITHMETIC_ATOL  # a few float32 ulps of an order-1 output
