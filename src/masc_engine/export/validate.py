"""Post-export validation: each ONNX graph against PyTorch, on shapes other than the traced ones.

The vision check feeds the *reference* path on the PyTorch side (transformers' image processor,
``vision_model(pixel_values, pixel_attention_mask, spatial_shapes)``) and the *runtime* path on
the ONNX side (runtime/preprocess.py, runtime/position.py), so it validates our preprocessing and
position-embedding resize together with the graph. Reports are Polygraphy-style (max, mean and
99th-percentile absolute error), not booleans; a failure raises :class:`ExportValidationError`
carrying the report.

Each check is two halves: ``*_references`` runs the PyTorch side once and returns small arrays
(the exporter computes them in its PyTorch worker, export/torch_worker.py, before any ONNX Runtime
session exists), and ``check_*`` / :func:`check_graph` runs one ONNX graph against them, so no
step holds the PyTorch weights and an ONNX Runtime session at once. The ``validate_*`` functions
do both in one process.

The gates the checks end in (the error figures, the fp32 budgets with their one-line refusal and
``--accept-validation-error`` override, the reduced-precision cosine gates) are in
export/validation_gates.py; their names import from here as well.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypedDict

import numpy as np
from PIL import Image

from ..errors import ExportValidationError
from ..engine.backends.onnxruntime import OrtRunner
from ..runtime.position import position_weights
from ..runtime.preprocess import ImageSettings, preprocess_image
from ..runtime.text import PromptTokenizer, TextSettings
from ..runtime.heads import best_match_cosines, masked_maxcos
from ..runtime.masks import DEFAULT_FG_THRESHOLD, cp_keep
from ..tolerances import CP_BEST_ATOL, CP_HEAD_ATOL, FIDELITY_MAX_ABS_DELTA
from .validation_gates import (  # the gates; callers import every name below from here too
    REDUCED_GATES,
    _check,
    _check_reduced,
    _round_up,  # noqa: F401
    accept_validation_error,  # noqa: F401
    cosine_stats,
    error_stats,
    refuse_or_accept,  # noqa: F401
    row_cosines,  # noqa: F401
)


def synthetic_image(height: int, width: int, seed: int) -> Image.Image:
    """A deterministic RGB test image with structure at several scales (not just noise)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width]
    base = np.stack(
        [(xx * 255 // max(width - 1, 1)), (yy * 255 // max(height - 1, 1)), ((xx // 8 + yy // 8) % 2) * 255], axis=-1
    ).astype(np.float64)
    noise = rng.normal(0, 40, size=(height, width, 3))
    return Image.fromarray(np.clip(base + noise, 0, 255).astype(np.uint8), "RGB")


# Image sizes whose NaFlex grids differ from the 64-patch trace (tall, wide, square, tiny).
VALIDATION_SIZES = [(224, 288), (480, 160), (37, 41), (512, 512)]


class VisionCase(TypedDict):
    """One case of the vision check (:func:`vision_references`): the graph's ``feeds``, the
    reference ``ref`` tokens, the NaFlex ``valid`` patches and ``grids`` (None on fixed-size
    graphs), and ``pixel_values``: max |error| of the runtime's pixels against the processor's."""

    grids: list[list[int]] | None
    valid: np.ndarray | None
    feeds: dict[str, np.ndarray]
    ref: np.ndarray
    pixel_values: float


def vision_references(vision_model, processor, image: dict) -> list[VisionCase]:
    """PyTorch's side of the vision check, computed once before any ONNX session exists.

    Each case: ``feeds`` (the runtime's preprocessing and position resize: what the graph gets),
    ``ref`` (the reference path: transformers' image processor and ``vision_model``'s
    ``last_hidden_state``), ``valid`` (NaFlex: the real patches; padding slots are hidden from
    every later step), ``grids`` and ``pixel_values`` (max |error| of our pixel values against the
    processor's). Batch 1, then a batch of 3 mixed grids (``VALIDATION_SIZES``).
    """
    import torch

    s = ImageSettings.from_manifest(image)
    cases = []
    for batch in ([VALIDATION_SIZES[0]], VALIDATION_SIZES[1:]):
        imgs = [synthetic_image(h, w, seed=h * 7 + w) for h, w in batch]
        pre = [preprocess_image(im, s) for im in imgs]
        grids: list[list[int]] | None = None
        valid: np.ndarray | None = None
        if s.mode == "naflex":
            ref_in = processor.image_processor(images=imgs, max_num_patches=s.max_num_patches, return_tensors="pt")
            with torch.no_grad():
                ref = vision_model(
                    pixel_values=ref_in["pixel_values"],
                    pixel_attention_mask=ref_in["pixel_attention_mask"],
                    spatial_shapes=ref_in["spatial_shapes"],
                ).last_hidden_state.numpy()
            feeds = {
                "pixel_values": np.stack([p.pixel_values for p in pre]),
                "pixel_attention_mask": np.stack([p.pixel_attention_mask for p in pre]),
                "position_weights": np.stack(
                    [position_weights(image["position_grid"], p.spatial_shape, s.max_num_patches) for p in pre]
                ),
            }
            valid = feeds["pixel_attention_mask"].astype(bool)
            grids = [list(p.spatial_shape) for p in pre]
        else:
            ref_in = processor.image_processor(images=imgs, return_tensors="pt")
            with torch.no_grad():
                ref = vision_model(pixel_values=ref_in["pixel_values"]).last_hidden_state.numpy()
            feeds = {"pixel_values": np.stack([p.pixel_values for p in pre])}
        pixel_error = error_stats(feeds["pixel_values"], ref_in["pixel_values"].numpy())["max_abs"]
        cases.append(VisionCase(grids=grids, valid=valid, feeds=feeds, ref=ref, pixel_values=pixel_error))
    return cases


def check_vision(runner, cases: list[VisionCase], gates: str = "fp32") -> dict:
    """The vision graph in ``runner`` against :func:`vision_references`' cases, with ``gates``."""
    out = []
    for case in cases:
        got = runner.run(case["feeds"])["last_hidden_state"]
        if case["valid"] is not None:  # padding slots are hidden from every later step
            stats = _stats(got[case["valid"]], case["ref"][case["valid"]], gates)
            stats["grids"] = case["grids"]
        else:
            stats = _stats(got, case["ref"], gates)
        stats["pixel_values"] = case["pixel_values"]
        out.append(stats)
    if gates in REDUCED_GATES:
        return _check_reduced("vision", out, gates, "tokens")
    return _check("vision", out)


def validate_vision(runner, model, processor, image: dict, gates: str = "fp32") -> dict:
    """:func:`check_vision` on the references of ``model`` (a transformers ``Siglip2Model``)."""
    return check_vision(runner, vision_references(model.vision_model, processor, image), gates)


def _stats(got, ref, gates: str) -> dict:
    return cosine_stats(got, ref) if gates in REDUCED_GATES else error_stats(got, ref)


def pool_references(head, width: int) -> list[dict]:
    """PyTorch's side of the pooling-head check: random hidden states (batch 1 x 30 tokens, batch
    3 x 97) with a random key_padding_mask through ``head.attention`` (masc-metric 0.3.0
    ``MaSC._pool_with_kpm``); each case ``{"feeds", "ref"}``."""
    import torch

    cases = []
    rng = np.random.default_rng(3)
    for b, n in [(1, 30), (3, 97)]:
        hidden = rng.normal(size=(b, n, width)).astype(np.float32)
        kpm = rng.random((b, n)) < 0.4
        kpm[:, 0] = False  # at least one visible key per row (the reference gives NaN otherwise)
        with torch.no_grad():
            x = torch.from_numpy(hidden)
            probe = head.probe.repeat(b, 1, 1)
            att = head.attention(probe, x, x, key_padding_mask=torch.from_numpy(kpm))[0]
            ref = (att + head.mlp(head.layernorm(att)))[:, 0].numpy()
        cases.append({"feeds": {"hidden": hidden, "key_padding_mask": kpm}, "ref": ref})
    return cases


def check_pool(runner, cases: list[dict], gates: str = "fp32") -> dict:
    """The pool graph in ``runner`` against :func:`pool_references`' cases, with ``gates``."""
    out = [_stats(runner.run(c["feeds"])["pooled"], c["ref"], gates) for c in cases]
    if gates in REDUCED_GATES:
        return _check_reduced("pool", out, gates, "embedding")
    return _check("pool", out)


def validate_pool(runner, model, gates: str = "fp32") -> dict:
    """:func:`check_pool` on the references of ``model``'s pooling head."""
    vm = model.vision_model
    return check_pool(runner, pool_references(vm.head, int(vm.config.hidden_size)), gates)


#: Prompts of the text check: case, punctuation, accents, the empty prompt; plus a long one when the
#: reference truncates.
VALIDATION_PROMPTS = [
    "a dog on the beach",
    "A CAT wearing pink glasses",
    "",
    "a backpack with the Eiffel Tower in the background, photographed at dusk",
    "caffè latte on a café table — naïve déjà vu",
]


def text_token_ids(processor, text: dict, bundle_dir: Path) -> np.ndarray:
    """The text check's token ids from the bundle's tokenizer, checked equal to the reference
    processor's (no PyTorch needed).

    Raises:
        ExportValidationError: a prompt whose ids differ (names the prompts).
    """
    prompts = list(VALIDATION_PROMPTS)
    if text["reference_truncates"]:
        prompts.append(" ".join(["a very long prompt about a red sneaker"] * 20))
    tok = PromptTokenizer(Path(bundle_dir) / text["tokenizer_file"], TextSettings.from_manifest(text))
    ids = np.stack([e.input_ids for e in tok.encode(prompts)])
    ref_ids = np.asarray(processor(text=prompts, padding="max_length", return_tensors="np")["input_ids"])
    if ref_ids.shape != ids.shape or not np.array_equal(ref_ids, ids):
        bad = [p for p, a, r in zip(prompts, ids, ref_ids) if a.shape != r.shape or not np.array_equal(a, r)]
        raise ExportValidationError(
            f"token ids differ from the reference processor for {bad!r}",
            {"ours": ids.tolist(), "reference": ref_ids.tolist()},
        )
    return ids


def text_references(text_model, ids: np.ndarray) -> list[dict]:
    """PyTorch's side of the text check: the text tower's pooled output for the first prompt
    alone, then the others in one batch; each case ``{"feeds", "ref"}``."""
    import torch

    cases = []
    for sel in ([0], list(range(1, len(ids)))):
        with torch.no_grad():
            ref = text_model(input_ids=torch.from_numpy(ids[sel])).pooler_output.numpy()
        cases.append({"feeds": {"input_ids": ids[sel]}, "ref": ref})
    return cases


def check_text(runner, cases: list[dict], gates: str = "fp32") -> dict:
    """The text graph in ``runner`` against :func:`text_references`' cases, with ``gates``."""
    out = [_stats(runner.run(c["feeds"])["text_embeds"], c["ref"], gates) for c in cases]
    report = _check_reduced("text", out, gates, "embedding") if gates in REDUCED_GATES else _check("text", out)
    report["token_ids_equal"] = sum(len(c["feeds"]["input_ids"]) for c in cases)
    return report


def validate_text(runner, model, processor, text: dict, bundle_dir: Path, gates: str = "fp32") -> dict:
    """:func:`check_text` on ``model``'s text tower, token ids checked first (:func:`text_token_ids`)."""
    ids = text_token_ids(processor, text, bundle_dir)
    return check_text(runner, text_references(model.text_model, ids), gates)


def cp_validation_cases(width: int, seed: int = 5) -> list[dict]:
    """Feeds for the ``cp`` graph plus the numpy head's expected results.

    Cases: one reference against many outputs of different lengths (padding slots), several
    references of different lengths with a padding output slot, and a reference with no kept
    patch. Tokens share a common component, so cosines spread over (0, 1) as real tokens' do.
    Each case: ``{"feeds", "pairs": [(r, k, cp, best)], "n_keep"}`` (``best`` on kept patches).
    """
    rng = np.random.default_rng(seed)
    base = rng.normal(size=(1, width)).astype(np.float32) * 1.5
    tok = lambda *shape: (rng.normal(size=shape + (width,)) + base).astype(np.float32)  # noqa: E731
    cases = []
    # (reference lengths, per reference the output lengths, reference with no kept patch or None)
    layouts = [
        ([37], [[37, 20, 51, 3, 37]], None),
        ([24, 40, 9], [[30, 30], [12], [40, 5]], None),
        ([16, 25], [[16, 16, 9], [25]], 0),
    ]
    for ref_lens, out_lens, empty in layouts:
        r, n = len(ref_lens), max(ref_lens)
        k = max(len(o) for o in out_lens)
        m = max(max(o) for o in out_lens)
        feeds = {
            "ref_tokens": np.zeros((r, n, width), np.float32),
            "ref_keep": np.zeros((r, n), bool),
            "out_tokens": np.zeros((r, k, m, width), np.float32),
            "out_valid": np.zeros((r, k, m), bool),
        }
        pairs, n_keep = [], []
        for a, (nl, ols) in enumerate(zip(ref_lens, out_lens)):
            ref = tok(nl)
            weights = rng.random(nl).astype(np.float32)
            if a == empty:
                weights *= DEFAULT_FG_THRESHOLD  # every weight <= the threshold: nothing kept
            keep = cp_keep(weights)
            feeds["ref_tokens"][a, :nl] = ref
            feeds["ref_keep"][a, :nl] = keep
            n_keep.append(int(keep.sum()))
            for b, ml in enumerate(ols):
                out = tok(ml)
                # Padding slots hold garbage: the graph must ignore them.
                feeds["out_tokens"][a, b] = tok(m) * 3
                feeds["out_tokens"][a, b, :ml] = out
                feeds["out_valid"][a, b, :ml] = True
                cp, _ = masked_maxcos(ref, out, weights)
                pairs.append((a, b, cp, np.where(keep, best_match_cosines(ref, out), 0).astype(np.float32)))
        cases.append({"feeds": feeds, "pairs": pairs, "n_keep": n_keep})
    return cases


def validate_cp(runner, width: int, gates: str = "fp32") -> dict:
    """The ``cp`` graph against the numpy head (runtime/heads.py ``masked_maxcos``).

    Checks per pair |Delta cp| (within ``tolerances.CP_HEAD_ATOL``), |Delta best| on every
    reference patch (0 where unkept; within ``tolerances.CP_BEST_ATOL``), ``n_keep`` (exact), and
    that a reference with no kept patch yields a finite cp (0). The report's ``max_abs`` is the cp
    error; a ``best`` or ``n_keep`` error past its own bound, or a non-finite output, fails too.
    With ``fp16`` / ``bf16`` gates the cp bound is ``FIDELITY_MAX_ABS_DELTA`` (2e-3) and ``best``
    is reported, not gated (its per-patch error is what the cp bound averages).
    """
    reduced = gates in REDUCED_GATES
    cp_atol = FIDELITY_MAX_ABS_DELTA if reduced else CP_HEAD_ATOL
    best_atol = float("inf") if reduced else CP_BEST_ATOL
    cases = []
    for case in cp_validation_cases(width):
        res = runner.run(case["feeds"])
        d_cp, d_best = [0.0], [0.0]
        for a, b, cp, best in case["pairs"]:
            nb = best.shape[0]
            d_best.append(float(np.abs(res["best"][a, b, :nb].astype(np.float64) - best).max()))
            got = float(res["cp"][a, b])
            if np.isnan(cp):
                d_cp.append(0.0 if np.isfinite(got) else float("inf"))
            else:
                d_cp.append(abs(got - cp))
        n_keep_err = float(np.abs(res["n_keep"] - np.asarray(case["n_keep"], np.float32)).max())
        shape = list(case["feeds"]["out_tokens"].shape)
        finite = bool(all(np.isfinite(v).all() for v in res.values()))
        ok = finite and max(d_best) <= best_atol and n_keep_err == 0
        cases.append(
            {
                "max_abs": max(d_cp) if ok else float("inf"),
                "best_max_abs": max(d_best),
                "best_atol": best_atol,
                "n_keep_max_abs": n_keep_err,
                "all_finite": finite,
                "shape": shape,
                "pairs": len(case["pairs"]),
            }
        )
    against = "the numpy head (runtime/heads.py)"
    if reduced:
        against += f" with the {gates} gates (export with --precision fp32 instead)"
    report = _check(
        "cp",
        cases,
        atol=cp_atol,
        against=against,
        budget_from="tolerances.FIDELITY_MAX_ABS_DELTA" if reduced else "tolerances.CP_HEAD_ATOL",
    )
    report["gates"] = gates
    return report


def torch_references(
    model,
    processor,
    image: dict,
    text: dict,
    bundle_dir: Path,
    graphs: tuple[str, ...] = ("vision", "pool", "text", "cp"),
) -> dict:
    """Every PyTorch output the checks of ``graphs`` compare against, computed before any ONNX
    Runtime session exists (:func:`check_graph` needs no PyTorch model): ``{graph: cases}`` plus
    ``width``. The exporter computes them in its PyTorch worker (export/torch_worker.py) tower by
    tower instead; this is the one-process form."""
    vm = model.vision_model
    width = int(vm.config.hidden_size)
    refs: dict = {"width": width}
    if "vision" in graphs:
        refs["vision"] = vision_references(vm, processor, image)
    if "pool" in graphs:
        refs["pool"] = pool_references(vm.head, width)
    if "text" in graphs:
        refs["text"] = text_references(model.text_model, text_token_ids(processor, text, bundle_dir))
    return refs


def check_graph(graph: str, path: Path, references: dict, gates: str = "fp32") -> dict:
    """Check one ONNX file of the bundle against stored PyTorch outputs (:func:`torch_references`;
    the numpy head for ``cp``) with ``gates`` (``fp32``: the per-shape budgets,
    ``tolerances.EXPORT_VALIDATION_BUDGETS``; ``fp16`` / ``bf16``: the reduced-precision gates).

    One ONNX Runtime session with lean CPU memory (no arena, no memory patterns) is opened for the
    check and closed after it, its memory handed back before the next stage.

    bf16 graphs run emulated on ONNX Runtime CPU, which has no bf16 kernels
    (export/precision.py :func:`~masc_engine.export.precision.emulate_bf16`); the report says so.

    Raises:
        ExportValidationError: a gate fails (the report is attached).
        ValueError: an unknown graph name.
    """
    import tempfile

    from .stages import release_memory

    checks: dict[str, Callable[[Any, Any, str], dict]] = {
        "vision": check_vision,
        "pool": check_pool,
        "text": check_text,
    }
    if graph not in checks and graph != "cp":
        raise ValueError(f"no validation for graph {graph!r}")
    path = Path(path)
    with tempfile.TemporaryDirectory() as tmp:
        run_path = path
        if gates == "bf16":
            from .precision import emulated_bf16_file

            run_path = emulated_bf16_file(path, Path(tmp) / path.name)
        runner = OrtRunner(run_path, graph, ort_memory="lean")
        try:
            if graph == "cp":
                report = validate_cp(runner, int(references["width"]), gates)
            else:
                report = checks[graph](runner, references[graph], gates)
        finally:
            del runner
            release_memory()
    if gates == "bf16":
        report["bf16_emulated"] = (
            "ONNX Runtime CPU has no bf16 kernels: ran the graph with float32 ops and every "
            "bfloat16 tensor rounded to bfloat16 where produced (export/precision.py)"
        )
    return report


def validate_graph(
    graph: str, path: Path, bundle_dir: Path, model, processor, image: dict, text: dict, gates: str = "fp32"
) -> dict:
    """:func:`check_graph` with the references computed from ``model`` first (one process).

    Raises:
        ExportValidationError: a gate fails (the report is attached).
        ValueError: an unknown graph name.
    """
    if graph not in ("vision", "pool", "text", "cp"):
        raise ValueError(f"no validation for graph {graph!r}")
    refs = torch_references(model, processor, image, text, bundle_dir, graphs=(graph,))
    return check_graph(graph, path, refs, gates)


def validation_pairs(n: int = 6, seed: int = 11) -> list:
    """Synthetic pairs of odd sizes for the reduced-precision pair gate: ``[Pair]`` with elliptic
    foreground masks (about 35% of the image) and prompts naming the subject."""
    from ..runtime.scorer import Pair

    sizes = [(224, 288), (480, 160), (333, 517), (512, 512), (97, 203), (640, 427), (300, 301), (181, 777)]
    prompts = [
        ("a photo of a dog on the beach", "dog"),
        ("a red backpack in the snow", "backpack"),
        ("a cat wearing sunglasses", "cat"),
    ]
    rng = np.random.default_rng(seed)
    pairs = []
    for i in range(n):
        (h1, w1), (h2, w2) = sizes[i % len(sizes)], sizes[(i + 3) % len(sizes)]
        ref, out = synthetic_image(h1, w1, seed + 2 * i), synthetic_image(h2, w2, seed + 2 * i + 1)
        masks = []
        for h, w in ((h1, w1), (h2, w2)):
            cy, cx = rng.uniform(0.35, 0.65) * h, rng.uniform(0.35, 0.65) * w
            yy, xx = np.mgrid[0:h, 0:w]
            masks.append(((((yy - cy) / (0.36 * h)) ** 2 + ((xx - cx) / (0.3 * w)) ** 2) <= 1).astype(np.uint8) * 255)
        prompt, name = prompts[i % len(prompts)]
        pairs.append(Pair(ref, masks[0], out, masks[1], prompt, name))
    return pairs


def pair_scores(bundle: Path, pairs=None) -> dict:
    """CP and PF of :func:`validation_pairs` (or ``pairs``) scored by ``bundle`` as masc-run
    scores them; the scorer's sessions are closed and their memory handed back before returning.

    Returns:
        ``{"cp": [...], "pf": [...]}`` (floats, NaN where a score is undefined).
    """
    import warnings

    from ..runtime.scorer import Scorer
    from .stages import release_memory

    pairs = validation_pairs() if pairs is None else pairs
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scorer = Scorer(bundle)
        results = scorer.score_batch(pairs)
    del scorer
    release_memory()
    return {"cp": [float(r.cp) for r in results], "pf": [float(r.pf) for r in results], "pairs": len(pairs)}


def validate_pairs(
    fp32_bundle: Path | None,
    reduced_bundle: Path,
    gates: str,
    pairs: list | None = None,
    fp32_scores: dict | None = None,
) -> dict:
    """The per-pair gate of a reduced-precision bundle: |dCP| and |dPF| <= ``FIDELITY_MAX_ABS_DELTA``
    against the same export's fp32 graphs (themselves validated against PyTorch just before), on
    :func:`validation_pairs`; every score finite where fp32's is.

    Args:
        fp32_bundle: the fp32 graphs, scored here; or None with ``fp32_scores``.
        reduced_bundle: the fp16 / bf16 bundle of the same export, scored here.
        gates: its precision (``fp16`` or ``bf16``), named in the report and the refusal.
        pairs: the ``runtime.scorer.Pair`` list scored (default :func:`validation_pairs`).
        fp32_scores: :func:`pair_scores` of the fp32 graphs on the same pairs, made earlier (the
            exporter scores its fp32 graphs before the precision transform replaces them, so no
            copy of them is kept and the two bundles are never in memory together).

    Raises:
        ExportValidationError: with the figures and the suggestion to export fp32.
        ValueError: neither ``fp32_bundle`` nor ``fp32_scores``.
    """
    pairs = validation_pairs() if pairs is None else pairs
    if fp32_scores is not None:
        ref = fp32_scores
    elif fp32_bundle is not None:
        ref = pair_scores(fp32_bundle, pairs)
    else:
        raise ValueError("validate_pairs needs fp32_bundle or fp32_scores")
    got = pair_scores(reduced_bundle, pairs)
    cp32, pf32 = np.array(ref["cp"]), np.array(ref["pf"])
    cpx, pfx = np.array(got["cp"]), np.array(got["pf"])
    finite = bool(
        np.array_equal(np.isfinite(cp32), np.isfinite(cpx)) and np.array_equal(np.isfinite(pf32), np.isfinite(pfx))
    )
    d_cp = float(np.nanmax(np.abs(cpx - cp32))) if np.isfinite(cp32).any() else 0.0
    d_pf = float(np.nanmax(np.abs(pfx - pf32))) if np.isfinite(pf32).any() else 0.0
    report = {
        "gates": gates,
        "pairs": len(pairs),
        "max_abs_dcp": d_cp,
        "max_abs_dpf": d_pf,
        "atol": FIDELITY_MAX_ABS_DELTA,
        "finite_where_fp32_finite": finite,
        "against": "this export's fp32 graphs (validated against PyTorch above)",
    }
    if not (finite and d_cp <= FIDELITY_MAX_ABS_DELTA and d_pf <= FIDELITY_MAX_ABS_DELTA):
        raise ExportValidationError(
            f"{gates} bundle fails its pair gates: max |dCP| {d_cp:.2e}, max |dPF| {d_pf:.2e} over {len(pairs)} "
            f"pairs (gate {FIDELITY_MAX_ABS_DELTA:g})"
            + ("" if finite else "; non-finite scores")
            + ". Export with --precision fp32 instead.",
            report,
        )
    return report
