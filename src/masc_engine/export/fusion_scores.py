"""The score check of the fused ``ort-cpu`` graphs (export/fusion.py): CP and PF against PyTorch.

Build time only. Every ordered pair of the ``validate.VALIDATION_SIZES`` images (tall, wide,
tiny, square grids) with an ellipse mask each, and two prompts (:data:`SCORE_PROMPTS`): CP is
``heads.masked_maxcos`` on each side's tokens, PF the cosine of the pooled output (foreground
hidden) to each prompt's embedding, within ``tolerances.ORACLE_SCORE_ATOL``. PyTorch's side
(:func:`score_references_vision`, :func:`score_references_text`) is computed before any ONNX
Runtime session exists, so no stage holds the PyTorch model and a session at once;
:func:`check_scores` then needs no PyTorch and takes any runners (export/fusion.py
``check_variant_scores`` runs it on the fused graphs of a bundle being written).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def _ellipse_mask(height: int, width: int, seed: int) -> np.ndarray:
    """``[H, W] uint8`` mask of an off-centre ellipse (foreground 255) covering 20-45% of the image."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width]
    cy, cx = height * rng.uniform(0.35, 0.65), width * rng.uniform(0.35, 0.65)
    ry, rx = height * rng.uniform(0.25, 0.38), width * rng.uniform(0.25, 0.38)
    return ((((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2) <= 1).astype(np.uint8) * 255


#: Prompts of the score check (PF against two texts).
SCORE_PROMPTS = ["a dog on the beach", "a red backpack with a city in the background"]


def _score_images(image: dict):
    """The score check's images (``validate.VALIDATION_SIZES``: tall, wide, tiny, square grids),
    their ellipse masks and our preprocessing of them."""
    from ..runtime.preprocess import ImageSettings, preprocess_image
    from .validate import VALIDATION_SIZES, synthetic_image

    s = ImageSettings.from_manifest(image)
    imgs = [synthetic_image(h, w, seed=h * 7 + w) for h, w in VALIDATION_SIZES]
    masks = [_ellipse_mask(h, w, seed=i) for i, (h, w) in enumerate(VALIDATION_SIZES)]
    return s, imgs, masks, [preprocess_image(im, s) for im in imgs]


def score_references_vision(vision_model, processor, image: dict) -> dict:
    """PyTorch's vision side of the score check (:func:`check_scores`), computed before any ONNX
    Runtime session exists: each image's patch tokens from ``vision_model(...)`` on the reference
    processor's inputs (all images in one padded batch), and for each output image the pooling
    head ``head.attention(..., key_padding_mask=...)`` with its foreground hidden (masc-metric
    0.3.0 ``MaSC._pool_with_kpm``). Also the graph side's feeds (our preprocessing, one batch
    padded to the longest) and mask weights, so the check needs no PyTorch."""
    import torch

    from ..runtime import heads
    from ..runtime.masks import mask_to_patch_grid
    from ..runtime.position import position_weights

    s, imgs, masks, pre = _score_images(image)
    counts = [p.spatial_shape[0] * p.spatial_shape[1] for p in pre]
    with torch.no_grad():
        if s.mode == "naflex":
            ref_in = processor.image_processor(images=imgs, max_num_patches=s.max_num_patches, return_tensors="pt")
            ref = vision_model(
                pixel_values=ref_in["pixel_values"],
                pixel_attention_mask=ref_in["pixel_attention_mask"],
                spatial_shapes=ref_in["spatial_shapes"],
            ).last_hidden_state.numpy()
        else:
            ref_in = processor.image_processor(images=imgs, return_tensors="pt")
            ref = vision_model(pixel_values=ref_in["pixel_values"]).last_hidden_state.numpy()
    if s.mode == "naflex":
        n = max(counts)
        feeds = {
            "pixel_values": np.stack([p.pixel_values[:n] for p in pre]),
            "pixel_attention_mask": np.stack([p.pixel_attention_mask[:n] for p in pre]),
            "position_weights": np.stack([position_weights(image["position_grid"], p.spatial_shape, n) for p in pre]),
        }
    else:
        feeds = {"pixel_values": np.stack([p.pixel_values for p in pre])}
    tokens = [ref[i, :c] for i, c in enumerate(counts)]
    weights = [mask_to_patch_grid(m, p.spatial_shape) for m, p in zip(masks, pre)]
    head = vision_model.head
    pooled: list[Any] = []
    for w_out, rt in zip(weights, tokens):
        kpm = heads.background_key_padding_mask(w_out)
        if kpm.all():
            pooled.append(None)
            continue
        with torch.no_grad():
            x = torch.from_numpy(rt[None])
            att = head.attention(head.probe, x, x, key_padding_mask=torch.from_numpy(kpm[None]))[0]
            pooled.append((kpm, (att + head.mlp(head.layernorm(att)))[0, 0].numpy()))
    return {
        "feeds": feeds,
        "counts": counts,
        "tokens": tokens,
        "weights": weights,
        "pooled": pooled,
        "grids": [list(p.spatial_shape) for p in pre],
    }


def score_prompt_ids(text: dict, bundle_dir: str | Path) -> np.ndarray:
    """Token ids of :data:`SCORE_PROMPTS` from the bundle's tokenizer (no PyTorch)."""
    from ..runtime.text import PromptTokenizer, TextSettings

    tok = PromptTokenizer(Path(bundle_dir) / text["tokenizer_file"], TextSettings.from_manifest(text))
    return np.stack([e.input_ids for e in tok.encode(SCORE_PROMPTS)])


def score_references_text(text_model, ids: np.ndarray) -> dict:
    """PyTorch's text side of the score check: the text tower's pooled output for ``ids``."""
    import torch

    with torch.no_grad():
        return {"ids": ids, "embeds": text_model(input_ids=torch.from_numpy(ids)).pooler_output.numpy()}


def check_scores(refs: dict, runner_for) -> dict:
    """CP and PF from a graph set against the same scores from PyTorch, on off-trace shapes.

    Every ordered pair of the ``validate.VALIDATION_SIZES`` images (tall, wide, tiny, square
    grids) with an ellipse mask each, and two prompts. CP is ``heads.masked_maxcos`` on each
    side's tokens; PF the cosine of the pooled output (foreground hidden) to each prompt's
    embedding.

    Args:
        refs: ``{"vision": score_references_vision(...), "text": score_references_text(...)}``.
        runner_for (callable): ``graph -> runner`` for ``vision``, ``text`` and ``pool``; called once per
            graph, in that order, and the runner dropped (with its memory) before the next.

    Returns:
        ``{"max_abs": max(|dCP|, |dPF|), "max_abs_dcp", "max_abs_dpf", "pairs", "atol", "cases"}``.

    Raises:
        ExportValidationError: past ``tolerances.ORACLE_SCORE_ATOL`` (1e-5), or a NaN on one side only.
    """
    from ..runtime import heads
    from ..tolerances import ORACLE_SCORE_ATOL
    from .stages import release_memory
    from .validate import _check

    v, t = refs["vision"], refs["text"]
    got = runner_for("vision").run(v["feeds"])["last_hidden_state"]
    got_tok = [got[i, :c] for i, c in enumerate(v["counts"])]
    del got
    release_memory()
    t_got = runner_for("text").run({"input_ids": t["ids"]})["text_embeds"]
    release_memory()
    pool = runner_for("pool")
    d_cp, d_pf, pairs = [], [], 0
    for j, (pooled, gt) in enumerate(zip(v["pooled"], got_tok)):
        if pooled is None:
            continue
        kpm, pooled_ref = pooled
        pooled_got = pool.run({"hidden": gt[None], "key_padding_mask": kpm[None]})["pooled"][0]
        for k in range(len(t["ids"])):
            d_pf.append(abs(heads.cosine(pooled_got, t_got[k]) - heads.cosine(pooled_ref, t["embeds"][k])))
        for i in range(len(got_tok)):
            if i == j:
                continue
            cp_ref, _ = heads.masked_maxcos(v["tokens"][i], v["tokens"][j], v["weights"][i])
            cp_got, _ = heads.masked_maxcos(got_tok[i], gt, v["weights"][i])
            if np.isnan(cp_ref) != np.isnan(cp_got):
                d_cp.append(float("inf"))
            elif not np.isnan(cp_ref):
                d_cp.append(abs(cp_got - cp_ref))
            pairs += 1
    del pool
    release_memory()
    case = {
        "max_abs": float(max(d_cp + d_pf)),
        "max_abs_dcp": float(max(d_cp)),
        "max_abs_dpf": float(max(d_pf)),
        "pairs": pairs,
        "grids": v["grids"],
        "prompts": len(t["ids"]),
    }
    report = _check("scores", [case], atol=ORACLE_SCORE_ATOL, against="PyTorch (CP and PF)")
    report.update(max_abs_dcp=case["max_abs_dcp"], max_abs_dpf=case["max_abs_dpf"], pairs=pairs)
    return report


def validate_scores(
    model, processor, image: dict, text: dict, bundle_dir: Path, vision_runner, text_runner, pool_runner
) -> dict:
    """:func:`check_scores` on open runners, the references computed from ``model`` (a
    transformers ``Siglip2Model``) first."""
    refs = {
        "vision": score_references_vision(model.vision_model, processor, image),
        "text": score_references_text(model.text_model, score_prompt_ids(text, bundle_dir)),
    }
    runners = {"vision": vision_runner, "text": text_runner, "pool": pool_runner}
    return check_scores(refs, runners.__getitem__)
