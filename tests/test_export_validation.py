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
from masc_engine.tolerances import export_validation_atol

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


CHECKS = {"vision": (val.check_vision, "last_hidden_state"), "pool": (val.check_pool, "pooled"),
          "text": (val.check_text, "text_embeds")}


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
