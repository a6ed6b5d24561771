"""Post-export validation of a segmenter bundle against transformers' ``CLIPSegForImageSegmentation``.

Like export/validate.py for the scorer's graphs: right after export, on batch sizes other than the
traced one (2) and images of other sizes and aspect ratios, Polygraphy-style reports (max, mean,
99th-percentile error; :func:`~masc_engine.export.validate.error_stats`), a failure raising
:class:`ExportValidationError` with the report. Checks:

- ``pixel_values``: runtime/preprocess.py against the checkpoint's image processor (exact up to
  ``tolerances.PIXEL_VALUES_ATOL``);
- ``token_ids``: the bundle's tokenizer (runtime/text.py) against the checkpoint's, exact;
- each graph alone on the reference's own inputs (``vision`` activations, ``text`` conditional
  embeddings, ``decoder`` logits);
- ``end_to_end``: the runtime :class:`~masc_engine.runtime.segmenter.Segmenter` (preprocessing,
  tokenizer, the three graphs) against ``CLIPSegForImageSegmentation(input_ids, pixel_values,
  attention_mask).logits`` from the processor's own inputs.

fp32 budgets are relative (max |error| / max |reference|, per case), per graph and per model
shape: ``tolerances.SEGMENTER_VALIDATION_BUDGETS``. Random weights give activations and logits
of another scale than the real checkpoint's (logits in the hundreds), so a scale-free bound is
what carries over. fp16 graphs are held to the reduced-precision gates (cosines, export/validate.py
``_check_reduced``) and, end to end, to a mask IoU gate (``tolerances.SEGMENTER_REDUCED_MIN_MASK_IOU``).
"""

from __future__ import annotations

import logging
import warnings
import weakref
from pathlib import Path

import numpy as np

from ..engine.backends.onnxruntime import OrtRunner
from ..errors import ExportValidationError
from ..runtime.preprocess import ImageSettings, preprocess_image
from ..runtime.segmenter import MaskRecipe, Segmenter, sigmoid, threshold_mask
from ..runtime.text import PromptTokenizer, TextSettings
from ..tolerances import (
    FLOAT32_EPS,
    PIXEL_VALUES_ATOL,
    SEGMENTER_REDUCED_MIN_MASK_IOU,
    segmenter_noise_factor,
    segmenter_validation_budget,
)
from .validate import (
    REDUCED_GATES,
    VALIDATION_SIZES,
    _check_reduced,
    cosine_stats,
    error_stats,
    refuse_or_accept,
    synthetic_image,
)

logger = logging.getLogger(__name__)

#: Subject names (prompts) of the validation cases: a word, a phrase, accents and a dash, case.
PROMPTS = ["dog", "a red backpack in the snow", "caffè latte — naïve", "A CAT wearing pink glasses"]


def _cases():
    """Batch 1, then batch 3 of mixed sizes (the graphs were traced at batch 2)."""
    imgs = [synthetic_image(h, w, seed=h * 7 + w) for h, w in VALIDATION_SIZES]
    return [([imgs[0]], PROMPTS[:1]), (imgs[1:], PROMPTS[1:])]


#: transformers' outputs on :func:`_cases`, per model object: every check of one export reads the
#: same reference (computed once instead of once per graph and transform).
_REFERENCES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _case_references(m, processor) -> list[tuple[list, list, dict]]:
    """``[(images, prompts, reference)]`` for :func:`_cases`."""
    if m not in _REFERENCES:
        _REFERENCES[m] = [(imgs, prompts, _reference(m, processor, imgs, prompts)) for imgs, prompts in _cases()]
    return _REFERENCES[m]


#: The checks whose budget follows transformers' own float32 error on the checkpoint (their error
#: spread is wide across initialisations: tolerances.SEGMENTER_NOISE_FACTOR).
NOISE_CHECKS = ("decoder", "end_to_end")


def _check(name: str, cases: list[dict], width: int) -> dict:
    """Raise unless every case's relative error (max |error| / max |reference|) is in budget.

    The budget of ``vision`` and ``text`` is their per-shape constant. For ``decoder`` and
    ``end_to_end`` it is the larger of that constant (a floor) and ``SEGMENTER_NOISE_FACTORS`` x
    transformers' own float32 relative error on this checkpoint (the cases' ``noise_rel``: max
    |float32 - float64| / max |reference|, at least float32's epsilon), so an ill-conditioned
    checkpoint (logits in the thousands, where float32 rounding alone moves them by 1e-4) is held
    to its own arithmetic's precision. Cases without ``noise_rel`` get the floor alone.
    """
    budget, source = segmenter_validation_budget(name, width)
    worst = max(c["max_rel"] for c in cases)
    report = {
        "max_rel": worst,
        "rtol": budget,
        "budget_from": source,
        "max_abs": max(c["max_abs"] for c in cases),
        "cases": cases,
    }
    noise = [c["noise_rel"] for c in cases if "noise_rel" in c]
    if name in NOISE_CHECKS and noise:
        noise_rel = max(max(noise), FLOAT32_EPS)
        report.update(noise_rel=noise_rel, rtol_floor=budget, error_over_noise=worst / noise_rel)
        factor, factor_from = segmenter_noise_factor(width)
        if factor * noise_rel > budget:
            budget = report["rtol"] = factor * noise_rel
            source = report["budget_from"] = (
                f"{factor_from} {factor:g} x transformers' own float32 relative "
                f"error on this checkpoint {noise_rel:.3g}; floor {report['rtol_floor']:g} from {source}"
            )
    return refuse_or_accept(
        f"segmenter graph {name!r} differs from transformers", "max relative error", worst, budget, source, report
    )


def _float64(m):
    """A float64 copy of ``m`` (``m`` itself untouched): transiently twice its float32 size more."""
    import copy

    return copy.deepcopy(m).double()


def _noise(m, inp, acts, cond, dec32: np.ndarray, full32: np.ndarray) -> dict:
    """transformers' own float32 error on these inputs: max |float32 - float64| of the decoder's
    logits (on the same float32 activations and conditional embeddings) and of the full model's."""
    import torch

    m64 = _float64(m)
    with torch.no_grad():
        dec64 = m64.decoder(tuple(acts[:, i].double() for i in range(acts.shape[1])), cond.double()).logits
        full64 = m64(
            input_ids=inp["input_ids"], pixel_values=inp["pixel_values"].double(), attention_mask=inp["attention_mask"]
        ).logits
    del m64
    return {
        "decoder_noise": float(np.abs(dec64.numpy() - dec32).max()),
        "logits_noise": float(np.abs(full64.numpy() - full32).max()),
    }


def _reference(m, processor, images, prompts) -> dict:
    """transformers' inputs and outputs for ``images`` prompted by ``prompts`` (one each)."""
    import torch

    inp = processor(text=prompts, images=images, padding=True, return_tensors="pt")
    with torch.no_grad():
        vis = m.clip.vision_model(pixel_values=inp["pixel_values"], output_hidden_states=True)
        acts = torch.stack([vis.hidden_states[i + 1] for i in m.extract_layers], dim=1)
        cond = m.clip.get_text_features(input_ids=inp["input_ids"], attention_mask=inp["attention_mask"]).pooler_output
        dec = m.decoder(tuple(acts[:, i] for i in range(acts.shape[1])), cond).logits
        full = m(
            input_ids=inp["input_ids"], pixel_values=inp["pixel_values"], attention_mask=inp["attention_mask"]
        ).logits
    return {
        "pixel_values": inp["pixel_values"].numpy(),
        "input_ids": inp["input_ids"].numpy(),
        "attention_mask": inp["attention_mask"].numpy(),
        "activations": acts.numpy(),
        "conditional_embeddings": cond.numpy(),
        "decoder_logits": dec.numpy(),
        "logits": full.numpy(),
        **_noise(m, inp, acts, cond, dec.numpy(), full.numpy()),
    }


def check_inputs(bundle_dir: Path, processor, image: dict, text: dict) -> dict:
    """Pixel values and token ids of the runtime against the checkpoint's processor.

    Raises:
        ExportValidationError: pixel values beyond ``PIXEL_VALUES_ATOL``, or any token id differs.
    """
    s = ImageSettings.from_manifest(image)
    imgs = [synthetic_image(h, w, seed=h * 7 + w) for h, w in VALIDATION_SIZES]
    ours = np.stack([preprocess_image(im, s).pixel_values for im in imgs])
    ref = processor.image_processor(images=imgs, return_tensors="np")["pixel_values"]
    px = error_stats(ours, ref)
    tok = PromptTokenizer(Path(bundle_dir) / text["tokenizer_file"], TextSettings.from_manifest(text))
    bad = []
    for p, e in zip(PROMPTS, tok.encode(PROMPTS)):
        want = list(processor.tokenizer(p)["input_ids"])
        n = len(want)
        if list(e.input_ids[:n]) != want or set(e.input_ids[n:].tolist()) - {text["pad_token_id"]}:
            bad.append(p)
    report = {"pixel_values": px, "token_ids_equal": len(PROMPTS) - len(bad)}
    if px["max_abs"] > PIXEL_VALUES_ATOL or bad:
        raise ExportValidationError(
            f"segmenter inputs differ from the checkpoint's processor: pixel values max "
            f"|error| {px['max_abs']:.3g}, token ids differ for {bad!r}",
            report,
        )
    return report


def validate_graph(
    graph: str, path: Path, bundle_dir: Path, m, processor, image: dict, text: dict, gates: str = "fp32"
) -> dict:
    """One graph file against transformers on the reference's own inputs, with ``gates``
    (``fp32``: ``tolerances.SEGMENTER_VALIDATION_BUDGETS``; ``fp16``: the cosine gates).

    Raises:
        ExportValidationError: a gate fails.
        ValueError: an unknown graph name or gates.
    """
    if graph not in ("vision", "text", "decoder") or gates not in ("fp32", "fp16"):
        raise ValueError(f"no segmenter validation for graph {graph!r} with {gates!r} gates")
    runner = OrtRunner(Path(path), graph)
    cases = []
    for _, _, ref in _case_references(m, processor):
        if graph == "vision":
            got, want = runner.run({"pixel_values": ref["pixel_values"]})["activations"], ref["activations"]
        elif graph == "text":
            ids = _pad(ref["input_ids"], int(text["max_length"]), int(text["pad_token_id"]))
            got, want = runner.run({"input_ids": ids})["conditional_embeddings"], ref["conditional_embeddings"]
        else:
            got = runner.run(
                {"activations": ref["activations"], "conditional_embeddings": ref["conditional_embeddings"]}
            )["logits"]
            want = ref["decoder_logits"]
        cases.append(cosine_stats(got, want) if gates in REDUCED_GATES else error_stats(got, want))
        if graph == "decoder" and gates not in REDUCED_GATES:
            cases[-1]["noise_rel"] = _relative(ref["decoder_noise"], want)
    if gates in REDUCED_GATES:
        # vision: per-token cosines (median and 0.1st percentile gates); text: per-prompt cosine;
        # decoder: per row of the [S, S] logit map (S values each), every row >= the gate.
        return _check_reduced(graph, cases, gates, "tokens" if graph == "vision" else "embedding")
    return _check(graph, cases, int(m.config.vision_config.hidden_size))


def _relative(noise: float, ref: np.ndarray) -> float:
    """``noise`` over max |``ref``| (as error_stats' ``max_rel``)."""
    return noise / (float(np.abs(ref).max()) or 1.0)


def _pad(ids: np.ndarray, length: int, pad_id: int) -> np.ndarray:
    out = np.full((ids.shape[0], length), pad_id, dtype=np.int64)
    out[:, : ids.shape[1]] = ids
    return out


def validate_end_to_end(bundle_dir: Path, m, processor) -> dict:
    """The runtime Segmenter's logits against ``CLIPSegForImageSegmentation``'s (fp32 budget
    ``end_to_end``). The bundle's manifest must be written (files not yet hashed is fine)."""
    cases = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        seg = Segmenter(bundle_dir, verify=False)
    for images, prompts, ref in _case_references(m, processor):
        cases.append(error_stats(seg.logits(images, prompts), ref["logits"]))
        cases[-1]["noise_rel"] = _relative(ref["logits_noise"], ref["logits"])
    return _check("end_to_end", cases, int(m.config.vision_config.hidden_size))


def validate_segmenter(bundle_dir: Path, graphs: dict, m, processor, image: dict, text: dict) -> dict:
    """Every fp32 check; ``{check: report}`` or :class:`ExportValidationError`."""
    bundle_dir = Path(bundle_dir)
    report = {"inputs": check_inputs(bundle_dir, processor, image, text)}
    for g, entry in graphs.items():
        report[g] = validate_graph(g, bundle_dir / entry["file"], bundle_dir, m, processor, image, text)
    report["end_to_end"] = validate_end_to_end(bundle_dir, m, processor)
    for k, v in report.items():
        if "max_rel" in v:
            logger.info(
                f"validated {k}: max relative error {v['max_rel']:.2e} (budget {v['rtol']:g}) over {len(v['cases'])} cases"
            )
    return report


def mask_iou(a: np.ndarray, b: np.ndarray) -> float:
    """Intersection over union of two boolean masks (1.0 when both are empty)."""
    a, b = np.asarray(a, bool), np.asarray(b, bool)
    union = np.count_nonzero(a | b)
    return 1.0 if union == 0 else float(np.count_nonzero(a & b)) / union


def validate_reduced_masks(bundle_dir: Path, m, processor, precision: str) -> dict:
    """End-to-end gate of an fp16 segmenter: the runtime Segmenter on the fp16 graphs against
    transformers fp32, masks at the recipe's default threshold on the ``S x S`` map, IoU >=
    ``tolerances.SEGMENTER_REDUCED_MIN_MASK_IOU`` per case.

    Raises:
        ExportValidationError: with the figures and the suggestion to export fp32.
    """
    threshold = MaskRecipe().threshold
    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        seg = Segmenter(Path(bundle_dir), verify=False)
    for images, prompts, ref in _case_references(m, processor):
        for g, r in zip(seg.logits(images, prompts), ref["logits"]):
            rows.append(mask_iou(threshold_mask(sigmoid(g), threshold), threshold_mask(sigmoid(r), threshold)))
    report = {
        "gates": precision,
        "min_iou": min(rows),
        "ious": rows,
        "min_iou_gate": SEGMENTER_REDUCED_MIN_MASK_IOU,
        "threshold": threshold,
        "against": "transformers CLIPSegForImageSegmentation, fp32",
    }
    if min(rows) < SEGMENTER_REDUCED_MIN_MASK_IOU:
        raise ExportValidationError(
            f"{precision} segmenter masks differ from fp32: min IoU {min(rows):.4f} < "
            f"{SEGMENTER_REDUCED_MIN_MASK_IOU}. Export with --precision fp32 instead.",
            report,
        )
    return report
