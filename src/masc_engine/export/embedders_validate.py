"""Post-export validation of an embedder bundle (export/embedders.py) against transformers.

Right after export, each graph runs in ONNX Runtime on batch sizes other than the traced one (2):
batch 1 and batch 3, and its output is compared with transformers' own forward pass on the same
inputs (not the exported wrapper modules):

- ``image``: CLIP ``visual_projection(vision_model(pixel_values).pooler_output)``; DINO
  ``ViTModel(pixel_values).last_hidden_state[:, 0]`` (LayerNorm eps 1e-6); DINOv2
  ``Dinov2Model(pixel_values).last_hidden_state[:, 0]`` (transformers interpolating its position
  grid itself at 224);
- ``text``: ``text_projection(text_model(input_ids, attention_mask).pooler_output)`` on prompts
  padded to 77 tokens; the graph gets the ids alone (no mask), padded to 77 and, where its
  sequence axis is dynamic, also cut as the runtime cuts them (runtime/embedder.py
  ``text_run_lengths``), each prompt alone.

Pixel values are seeded standard-normal tensors (the normalised range; preprocessing is the
runtime's, checked there). Reported per case: max / mean / p99 absolute error and the max relative
error (max |error| / max |reference|); the budget is relative, per family and graph
(``tolerances.EMBEDDER_VALIDATION_BUDGETS``), and a failure raises
:class:`~masc_engine.errors.ExportValidationError` with the report.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from ..engine.backends.onnxruntime import OrtRunner
from ..runtime.embedder import text_run_lengths
from ..tolerances import embedder_validation_budget
from .validate import error_stats, refuse_or_accept

logger = logging.getLogger(__name__)

#: Prompts of the text check (batch 1, then 3): a word, a phrase, accents and a dash, case.
PROMPTS = ["dog", "a red backpack in the snow", "caffè latte — naïve", "A CAT wearing pink glasses"]
#: Batch sizes checked (the graphs are traced at 2).
BATCHES = (1, 3)


def pixel_cases(size: int = 224) -> list[np.ndarray]:
    """``[B, 3, size, size] float32`` inputs, one per batch size of :data:`BATCHES` (seeded)."""
    rng = np.random.default_rng(7)
    return [rng.standard_normal((b, 3, size, size)).astype(np.float32) for b in BATCHES]


def text_cases(tokenizer, length: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """``(input_ids, attention_mask)`` int64 ``[B, length]`` per batch size, padded to ``length``."""
    out, start = [], 0
    for b in BATCHES:
        enc = tokenizer(
            PROMPTS[start : start + b], padding="max_length", max_length=length, truncation=True, return_tensors="np"
        )
        out.append((enc["input_ids"].astype(np.int64), enc["attention_mask"].astype(np.int64)))
        start += b
    return out


def reference_image(m, family: str, pixel_values: np.ndarray) -> np.ndarray:
    """transformers' image embedding of ``family`` for ``pixel_values`` (``[B, D]`` float32)."""
    import torch

    pv = torch.from_numpy(pixel_values)
    with torch.no_grad():
        if family == "clip":
            return m.visual_projection(m.vision_model(pixel_values=pv).pooler_output).numpy()
        return m(pixel_values=pv).last_hidden_state[:, 0].numpy()


def reference_text(m, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
    """``text_projection`` of CLIP's pooled text state, with the attention mask (``[B, P]``)."""
    import torch

    with torch.no_grad():
        pooled = m.text_model(
            input_ids=torch.from_numpy(input_ids), attention_mask=torch.from_numpy(attention_mask)
        ).pooler_output
        return m.text_projection(pooled).numpy()


def _check(graph: str, family: str, width: int, cases: list[dict]) -> dict:
    budget, source = embedder_validation_budget(family, graph, width)
    worst = max(c["max_rel"] for c in cases)
    report = {
        "max_rel": worst,
        "rtol": budget,
        "budget_from": source,
        "max_abs": max(c["max_abs"] for c in cases),
        "cases": cases,
    }
    return refuse_or_accept(
        f"embedder graph {graph!r} differs from transformers", "max relative error", worst, budget, source, report
    )


def validate_graph(graph: str, path: Path, m, processor, family: str, text: dict | None) -> dict:
    """One graph file against transformers on batch 1 and 3.

    Raises:
        ExportValidationError: the max relative error is past the graph's budget.
        ValueError: an unknown graph name; the text graph without ``text`` settings.
    """
    if graph not in ("image", "text"):
        raise ValueError(f"no embedder validation for graph {graph!r}")
    runner = OrtRunner(Path(path), graph)
    cases = []
    if graph == "image":
        for pv in pixel_cases():
            cases.append(error_stats(runner.run({"pixel_values": pv})["image_embeds"], reference_image(m, family, pv)))
    elif text is None:
        raise ValueError("the text graph is validated with the bundle's text settings: none given")
    else:
        dynamic = not isinstance(runner.session.get_inputs()[0].shape[1], int)
        for ids, mask in text_cases(processor.tokenizer, int(text["max_length"])):
            ref = reference_text(m, ids, mask)
            cases.append(error_stats(runner.run({"input_ids": ids})["text_embeds"], ref))
            if dynamic:
                cut = [ids[i : i + 1, :n] for i, n in enumerate(text_run_lengths(ids, text))]
                got = np.concatenate([runner.run({"input_ids": c})["text_embeds"] for c in cut])
                cases.append({**error_stats(got, ref), "cut_to": [c.shape[1] for c in cut]})
    vc = m.config.vision_config if family == "clip" else m.config
    return _check(graph, family, int(vc.hidden_size), cases)


def validate_embedder(
    bundle_dir: Path, graphs: dict, m, processor, family: str, text: dict | None, source: dict | None = None
) -> dict:
    """Every graph's check; ``{graph: report}`` or :class:`ExportValidationError`."""
    report = {}
    for g, entry in graphs.items():
        report[g] = validate_graph(g, Path(bundle_dir) / entry["file"], m, processor, family, text)
        logger.info(
            f"validated {g}: max relative error {report[g]['max_rel']:.2e}, max |error| "
            f"{report[g]['max_abs']:.2e} (budget {report[g]['rtol']:g}) over {len(report[g]['cases'])} cases"
        )
    return report
