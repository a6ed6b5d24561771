"""Post-export validation: each ONNX graph against PyTorch, on shapes other than the traced ones.

The vision check feeds the *reference* path on the PyTorch side (transformers' image processor,
``vision_model(pixel_values, pixel_attention_mask, spatial_shapes)``) and the *runtime* path on
the ONNX side (runtime/preprocess.py, runtime/position.py), so it validates our preprocessing and
position-embedding resize together with the graph. Reports are Polygraphy-style (max, mean and
99th-percentile absolute error), not booleans; a failure raises :class:`ExportValidationError`
carrying the report.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from ..errors import ExportValidationError
from ..engine.backends.onnxruntime import OrtRunner
from ..runtime.position import position_weights
from ..runtime.preprocess import ImageSettings, preprocess_image
from ..runtime.text import PromptTokenizer, TextSettings
from ..runtime.heads import best_match_cosines, masked_maxcos
from ..tolerances import CP_BEST_ATOL, CP_HEAD_ATOL, EXPORT_VALIDATION_ATOL


def error_stats(actual: np.ndarray, expected: np.ndarray) -> dict:
    """max / mean / p99 absolute error and max relative error (vs max |expected|)."""
    d = np.abs(np.asarray(actual, np.float64) - np.asarray(expected, np.float64))
    scale = float(np.abs(expected).max()) or 1.0
    return {"max_abs": float(d.max()), "mean_abs": float(d.mean()),
            "p99_abs": float(np.quantile(d, 0.99)), "max_rel": float(d.max() / scale),
            "shape": list(np.shape(actual))}


def _check(name: str, cases: list[dict], atol: float = EXPORT_VALIDATION_ATOL,
           against: str = "PyTorch") -> dict:
    worst = max(c["max_abs"] for c in cases)
    report = {"max_abs": worst, "atol": atol, "cases": cases}
    if not np.isfinite(worst) or worst > atol:
        raise ExportValidationError(
            f"graph {name!r} differs from {against}: max |error| {worst:.3g} > {atol:g}", report,
        )
    return report


def synthetic_image(height: int, width: int, seed: int) -> Image.Image:
    """A deterministic RGB test image with structure at several scales (not just noise)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width]
    base = np.stack([(xx * 255 // max(width - 1, 1)), (yy * 255 // max(height - 1, 1)),
                     ((xx // 8 + yy // 8) % 2) * 255], axis=-1).astype(np.float64)
    noise = rng.normal(0, 40, size=(height, width, 3))
    return Image.fromarray(np.clip(base + noise, 0, 255).astype(np.uint8), "RGB")


# Image sizes whose NaFlex grids differ from the 64-patch trace (tall, wide, square, tiny).
VALIDATION_SIZES = [(224, 288), (480, 160), (37, 41), (512, 512)]


def validate_vision(runner, model, processor, image: dict) -> dict:
    import torch

    s = ImageSettings.from_manifest(image)
    vm = model.vision_model
    cases = []
    batches = [[VALIDATION_SIZES[0]], VALIDATION_SIZES[1:]]  # batch 1, then batch 3 of mixed grids
    for batch in batches:
        imgs = [synthetic_image(h, w, seed=h * 7 + w) for h, w in batch]
        pre = [preprocess_image(im, s) for im in imgs]
        if s.mode == "naflex":
            ref_in = processor.image_processor(images=imgs, max_num_patches=s.max_num_patches, return_tensors="pt")
            with torch.no_grad():
                ref = vm(pixel_values=ref_in["pixel_values"], pixel_attention_mask=ref_in["pixel_attention_mask"],
                         spatial_shapes=ref_in["spatial_shapes"]).last_hidden_state.numpy()
            feeds = {
                "pixel_values": np.stack([p.pixel_values for p in pre]),
                "pixel_attention_mask": np.stack([p.pixel_attention_mask for p in pre]),
                "position_weights": np.stack([position_weights(image["position_grid"], p.spatial_shape,
                                                               s.max_num_patches) for p in pre]),
            }
            got = runner.run(feeds)["last_hidden_state"]
            # Padding slots are hidden from every later step; compare the real patches.
            valid = feeds["pixel_attention_mask"].astype(bool)
            stats = error_stats(got[valid], ref[valid])
            stats["grids"] = [list(p.spatial_shape) for p in pre]
        else:
            ref_in = processor.image_processor(images=imgs, return_tensors="pt")
            with torch.no_grad():
                ref = vm(pixel_values=ref_in["pixel_values"]).last_hidden_state.numpy()
            got = runner.run({"pixel_values": np.stack([p.pixel_values for p in pre])})["last_hidden_state"]
            stats = error_stats(got, ref)
        stats["pixel_values"] = error_stats(
            np.stack([p.pixel_values for p in pre]), ref_in["pixel_values"].numpy())["max_abs"]
        cases.append(stats)
    return _check("vision", cases)


def validate_pool(runner, model) -> dict:
    import torch

    head = model.vision_model.head
    d = model.vision_model.config.hidden_size
    cases = []
    rng = np.random.default_rng(3)
    for b, n in [(1, 30), (3, 97)]:
        hidden = rng.normal(size=(b, n, d)).astype(np.float32)
        kpm = rng.random((b, n)) < 0.4
        kpm[:, 0] = False  # at least one visible key per row (the reference gives NaN otherwise)
        with torch.no_grad():
            x = torch.from_numpy(hidden)
            probe = head.probe.repeat(b, 1, 1)
            att = head.attention(probe, x, x, key_padding_mask=torch.from_numpy(kpm))[0]
            ref = (att + head.mlp(head.layernorm(att)))[:, 0].numpy()
        got = runner.run({"hidden": hidden, "key_padding_mask": kpm})["pooled"]
        cases.append(error_stats(got, ref))
    return _check("pool", cases)


def validate_text(runner, model, processor, text: dict, bundle_dir: Path) -> dict:
    import torch

    prompts = ["a dog on the beach", "A CAT wearing pink glasses", "",
               "a backpack with the Eiffel Tower in the background, photographed at dusk",
               "caffè latte on a café table — naïve déjà vu"]
    if text["reference_truncates"]:
        prompts.append(" ".join(["a very long prompt about a red sneaker"] * 20))
    tok = PromptTokenizer(bundle_dir / text["tokenizer_file"], TextSettings.from_manifest(text))
    ids = np.stack([e.input_ids for e in tok.encode(prompts)])
    ref_ids = np.asarray(processor(text=prompts, padding="max_length", return_tensors="np")["input_ids"])
    if ref_ids.shape != ids.shape or not np.array_equal(ref_ids, ids):
        bad = [p for p, a, r in zip(prompts, ids, ref_ids) if a.shape != r.shape or not np.array_equal(a, r)]
        raise ExportValidationError(f"token ids differ from the reference processor for {bad!r}",
                                    {"ours": ids.tolist(), "reference": ref_ids.tolist()})
    cases = []
    for sel in ([0], list(range(1, len(prompts)))):
        with torch.no_grad():
            ref = model.text_model(input_ids=torch.from_numpy(ids[sel])).pooler_output.numpy()
        got = runner.run({"input_ids": ids[sel]})["text_embeds"]
        cases.append(error_stats(got, ref))
    report = _check("text", cases)
    report["token_ids_equal"] = len(prompts)
    return report


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
    layouts = [([37], [[37, 20, 51, 3, 37]], None),
               ([24, 40, 9], [[30, 30], [12], [40, 5]], None),
               ([16, 25], [[16, 16, 9], [25]], 0)]
    for ref_lens, out_lens, empty in layouts:
        r, n = len(ref_lens), max(ref_lens)
        k = max(len(o) for o in out_lens)
        m = max(max(o) for o in out_lens)
        feeds = {"ref_tokens": np.zeros((r, n, width), np.float32), "ref_keep": np.zeros((r, n), bool),
                 "out_tokens": np.zeros((r, k, m, width), np.float32), "out_valid": np.zeros((r, k, m), bool)}
        pairs, n_keep = [], []
        for a, (nl, ols) in enumerate(zip(ref_lens, out_lens)):
            ref = tok(nl)
            weights = rng.random(nl).astype(np.float32)
            if a == empty:
                weights *= 0.5  # every weight <= 0.5: nothing kept
            keep = weights > np.float32(0.5)
            feeds["ref_tokens"][a, :nl] = ref
            feeds["ref_keep"][a, :nl] = keep
            n_keep.append(int(keep.sum()))
            for b, ml in enumerate(ols):
                out = tok(ml)
                # Padding slots hold garbage: the graph must ignore them.
                feeds["out_tokens"][a, b] = tok(m) * 3
                feeds["out_tokens"][a, b, :ml] = out
                feeds["out_valid"][a, b, :ml] = True
                cp, _ = masked_maxcos(ref, out, weights, 0.5)
                pairs.append((a, b, cp, np.where(keep, best_match_cosines(ref, out), 0).astype(np.float32)))
        cases.append({"feeds": feeds, "pairs": pairs, "n_keep": n_keep})
    return cases


def validate_cp(runner, width: int) -> dict:
    """The ``cp`` graph against the numpy head (runtime/heads.py ``masked_maxcos``).

    Checks per pair |Delta cp| (within ``tolerances.CP_HEAD_ATOL``), |Delta best| on every
    reference patch (0 where unkept; within ``tolerances.CP_BEST_ATOL``), ``n_keep`` (exact), and
    that a reference with no kept patch yields a finite cp (0). The report's ``max_abs`` is the cp
    error; a ``best`` or ``n_keep`` error past its own bound, or a non-finite output, fails too.
    """
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
        ok = finite and max(d_best) <= CP_BEST_ATOL and n_keep_err == 0
        cases.append({"max_abs": max(d_cp) if ok else float("inf"), "best_max_abs": max(d_best),
                      "best_atol": CP_BEST_ATOL, "n_keep_max_abs": n_keep_err, "all_finite": finite,
                      "shape": shape, "pairs": len(case["pairs"])})
    return _check("cp", cases, atol=CP_HEAD_ATOL, against="the numpy head (runtime/heads.py)")


def validate_bundle_graphs(bundle_dir: Path, model, processor, image: dict, text: dict, log=print) -> dict:
    """Run every check; return ``{graph: report}`` or raise :class:`ExportValidationError`."""
    bundle_dir = Path(bundle_dir)
    report = {
        "vision": validate_vision(OrtRunner(bundle_dir / "vision.onnx", "vision"), model, processor, image),
        "pool": validate_pool(OrtRunner(bundle_dir / "pool.onnx", "pool"), model),
        "text": validate_text(OrtRunner(bundle_dir / "text.onnx", "text"), model, processor, text, bundle_dir),
        "cp": validate_cp(OrtRunner(bundle_dir / "cp.onnx", "cp"), int(model.vision_model.config.hidden_size)),
    }
    for k, v in report.items():
        log(f"validated {k}: max |error| {v['max_abs']:.2e} (atol {v['atol']:g}) over {len(v['cases'])} cases")
    return report
