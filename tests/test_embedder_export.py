"""Embedder bundles (export/embedders.py): CLIP, DINO and DINOv2 graphs against transformers.

Every random preset exports, its manifest passes the bundle reader with the recipe of the
reference pipeline, and ONNX Runtime's embeddings equal transformers' on inputs the export never
saw (within the family's ``tolerances.EMBEDDER_VALIDATION_BUDGETS``). The DINO LayerNorm eps trap
(the Hub config's 1e-12 against DINO's 1e-6) is shown on a checkpoint whose LayerNorm inputs have a
variance near 1e-6, where the two eps differ by far more than the budget.
"""

from __future__ import annotations

import copy
import json
import warnings

import numpy as np
import pytest

from masc_engine.engine.bundle import Bundle
from masc_engine.engine.manifest import check_ranges
from masc_engine.errors import BundleError
from masc_engine.export.config_budget import estimate_parameters
from masc_engine.export.embedders import RECIPES, RECIPE_FIELDS, SHORT_NAMES, is_embedder_model
from masc_engine.export.plan import ExportPlan, ExportPlanError
from masc_engine.export.random_models import (
    EMBEDDER_BENCH_PRESETS,
    EMBEDDER_PRESETS,
    EMBEDDER_TEST_PRESETS,
    preset_config,
    random_embedder_model,
)
from masc_engine.tolerances import EMBEDDER_VALIDATION_BUDGETS, EMBEDDER_VALIDATION_RTOL, embedder_validation_budget

CLIP_MEAN, CLIP_STD = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]
IMAGENET_MEAN, IMAGENET_STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
#: The reference pipelines, written out (DreamBench++ clip_score.py / dino_score.py; DINO eval_knn.py).
EXPECTED = {
    "clip": dict(
        resize_mode="shortest_edge",
        size=224,
        interpolation="bicubic",
        crop_size=[224, 224],
        crop_rounding="hf_floor",
        image_mean=CLIP_MEAN,
        image_std=CLIP_STD,
    ),
    "dino": dict(
        resize_mode="shortest_edge",
        size=256,
        interpolation="bicubic",
        crop_size=[224, 224],
        crop_rounding="torchvision_round",
        image_mean=IMAGENET_MEAN,
        image_std=IMAGENET_STD,
    ),
    "dinov2": dict(
        resize_mode="shortest_edge",
        size=256,
        interpolation="bicubic",
        crop_size=[224, 224],
        crop_rounding="hf_floor",
        image_mean=IMAGENET_MEAN,
        image_std=IMAGENET_STD,
    ),
}
RULES = {"clip": "clip_image_projection", "dino": "cls_final_norm", "dinov2": "cls_layernorm"}


def _rel(got, want) -> float:
    return float(np.abs(np.asarray(got, np.float64) - want).max() / np.abs(want).max())


def _budget(family: str, graph: str = "image") -> float:
    """The budget of the family's tiny test preset (the narrowest measured shape)."""
    return embedder_validation_budget(family, graph, 48)[0]


# --------------------------------------------------------------------------- fast: no export


@pytest.mark.parametrize("key", sorted(EMBEDDER_TEST_PRESETS))
def test_config_budget_counts_the_preset_parameters(key):
    model = random_embedder_model(key)
    counted = sum(p.numel() for p in model.parameters())
    estimated = sum(estimate_parameters(preset_config(key))[0].values())
    if EMBEDDER_PRESETS[key].family == "clip":  # the test vocabulary's rows (preset_config counts its bound)
        counted += (1024 - model.config.text_config.vocab_size) * model.config.text_config.hidden_size
    assert abs(estimated - counted) <= 1  # CLIP's logit_scale is the one parameter not estimated


#: The Hub config.json shapes of the benchmark presets' checkpoints (vision width, layers, heads, MLP,
#: patch; text width, layers, heads, MLP; projection), written out from each checkpoint's config.
HUB_SHAPES = {
    "clip-b32": (768, 12, 12, 3072, 32, 512, 12, 8, 2048, 512),  # openai/clip-vit-base-patch32
    "clip-l14": (1024, 24, 16, 4096, 14, 768, 12, 12, 3072, 768),  # openai/clip-vit-large-patch14
    "dino-s16": (384, 12, 6, 1536, 16, 0, 0, 0, 0, 0),  # facebook/dino-vits16
}


@pytest.mark.parametrize("key", EMBEDDER_BENCH_PRESETS)
def test_benchmark_presets_have_the_hub_checkpoints_shapes(key):
    e = EMBEDDER_PRESETS[key]
    assert (
        e.width,
        e.layers,
        e.heads,
        e.mlp,
        e.patch_size,
        e.text_width,
        e.text_layers,
        e.text_heads,
        e.text_mlp,
        e.projection_dim,
    ) == HUB_SHAPES[key]
    assert e.image_size == 224 and key not in EMBEDDER_TEST_PRESETS


def test_clip_l14_short_name_and_tiny_preset_have_the_l14_layout():
    assert SHORT_NAMES["clip-vit-l14"] == "openai/clip-vit-large-patch14"
    e = EMBEDDER_PRESETS["clip-tiny-l14"]
    assert (e.family, e.patch_size, e.image_size) == ("clip", 14, 224) and "clip-tiny-l14" in EMBEDDER_TEST_PRESETS


def test_embedder_names_are_recognised_without_network():
    for name in list(SHORT_NAMES) + [f"random:{k}" for k in EMBEDDER_PRESETS]:
        assert is_embedder_model(name)
    assert not is_embedder_model("random:tiny-naflex") and not is_embedder_model("siglip2-so400m")


@pytest.mark.parametrize(
    "options",
    [
        dict(precision="fp16"),
        dict(precision="bf16"),
        dict(backend="tensorrt"),
        dict(max_num_patches=256),
        dict(precision="fp16", certify="bf16-cpu"),
        dict(certify="bf16-cpu", backend="tensorrt"),
    ],
)
def test_plan_refuses_other_than_fp32_onnx(options):
    with pytest.raises(ExportPlanError, match="embedder bundle|bf16-cpu"):
        ExportPlan(model="dino-vits16", kind="embedder", **options)
    ExportPlan(model="dino-vits16", kind="embedder")
    ExportPlan(model="dino-vits16", kind="embedder", certify="bf16-cpu")  # fp32 graphs, certified


def test_cli_refuses_fp16_in_one_line(tmp_path):
    from click.testing import CliRunner

    from masc_engine.cli.export_cmd import main

    res = CliRunner().invoke(
        main, ["--model", "random:dino-tiny-s16", "--out", str(tmp_path / "b"), "--precision", "fp16"]
    )
    assert res.exit_code == 2 and "embedder bundle" in res.output
    assert not (tmp_path / "b").exists()


def _manifest(family: str = "clip") -> dict:
    graph = {"file": "image.onnx", "inputs": [], "outputs": []}
    return {
        "kind": "embedder",
        "recipe": copy.deepcopy(RECIPES[family][0]),
        "source": {"model": "m"},
        "embedding": {"image": RULES[family], "text": "clip_text_projection" if family == "clip" else None, "dim": 512},
        "graphs": {"image": graph, **({"text": dict(graph, file="text.onnx")} if family == "clip" else {})},
    }


def test_recipe_schema_is_documented_field_by_field():
    for recipe, _ in RECIPES.values():
        assert set(recipe) == set(RECIPE_FIELDS)


@pytest.mark.parametrize(
    "edit, field",
    [
        (lambda m: m["recipe"].update(crop_rounding="round"), "recipe.crop_rounding"),
        (lambda m: m["recipe"].update(resize_mode="longest_edge"), "recipe.resize_mode"),
        (lambda m: m["recipe"].update(interpolation="lanczos"), "recipe.interpolation"),
        (lambda m: m["recipe"].update(size=0), "recipe.size"),
        (lambda m: m["recipe"].update(crop_size=[224]), "recipe.crop_size"),
        (lambda m: m["recipe"].update(image_std=[0.2, 0.0, 0.2]), "recipe.image_std"),
        (lambda m: m["recipe"].update(image_mean=[0.5, 0.5]), "recipe.image_mean"),
        (lambda m: m["recipe"].update(rescale_factor=0), "recipe.rescale_factor"),
        (lambda m: m["embedding"].update(dim=0), "embedding.dim"),
        (lambda m: m["source"].pop("model"), "source.model"),
        (lambda m: m["recipe"].update(alpha="drop"), "recipe.alpha"),
        (lambda m: m["recipe"].update(exif_transpose="yes"), "recipe.exif_transpose"),
        (lambda m: m["embedding"].update(image="mean_pool"), "embedding.image"),
        (lambda m: m["graphs"].pop("text"), "text graph"),
        (lambda m: m.pop("recipe"), "recipe table"),
    ],
)
def test_manifest_reader_refuses_a_bad_embedder_manifest(edit, field):
    m = _manifest()
    check_ranges(m, "b")
    edit(m)
    with pytest.raises(BundleError, match=field.replace(".", r"\.")):
        check_ranges(m, "b")


def test_budget_is_the_narrowest_measured_shape_at_least_as_wide():
    """A tower takes the budget of its family's narrowest measured shape at least as wide, and the
    generic bound past the widest (tolerances.EMBEDDER_VALIDATION_BUDGETS)."""
    tiny, wide = EMBEDDER_VALIDATION_BUDGETS["dino-tiny"], EMBEDDER_VALIDATION_BUDGETS["dino-s16"]
    budget, source = embedder_validation_budget("dino", "image", 48)
    assert budget == tiny["image"] and "'dino-tiny'" in source
    assert embedder_validation_budget("dino", "image", 49)[0] == wide["image"]
    assert "'dino-s16'" in embedder_validation_budget("dino", "image", 384)[1]
    budget, source = embedder_validation_budget("dino", "image", 385)
    assert budget == EMBEDDER_VALIDATION_RTOL and "unmeasured" in source
    assert embedder_validation_budget("clip", "text", 768)[0] == EMBEDDER_VALIDATION_BUDGETS["clip-b32"]["text"]
    assert embedder_validation_budget("dinov2", "image", 384)[0] == EMBEDDER_VALIDATION_RTOL


# --------------------------------------------------------------------------- slow: exports


@pytest.fixture(scope="module")
def bundles(embedder_bundles):
    """Every test preset's bundle, exported once per run (conftest ``embedder_bundles``)."""
    return {k: embedder_bundles[k] for k in EMBEDDER_TEST_PRESETS}


def _load(path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Bundle(path, verify="all", kind="embedder")


def _checkpoint(key: str):
    """The preset's checkpoint as transformers loads it (DINO: ViTModel as the config says, eps 1e-12)."""
    from transformers import AutoModel

    from masc_engine.export.checkpoint import random_checkpoint_dir

    return AutoModel.from_pretrained(random_checkpoint_dir(f"random:{key}"), attn_implementation="eager").eval()


def _run(bundle, graph: str, feed: dict) -> np.ndarray:
    from masc_engine.engine.backends.onnxruntime import OrtRunner

    entry = bundle.manifest["graphs"][graph]
    return OrtRunner(bundle.path / entry["file"], graph).run(feed)[entry["outputs"][0]["name"]]


def _pixels(batch: int, seed: int = 11) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, 3, 224, 224)).astype(np.float32)


@pytest.mark.slow
@pytest.mark.parametrize("key", sorted(EMBEDDER_TEST_PRESETS))
def test_preset_exports_a_valid_bundle_with_its_recipe(bundles, key):
    b = _load(bundles[key])
    family = EMBEDDER_PRESETS[key].family
    m = b.manifest
    assert m["kind"] == "embedder" and m["family"] == family and m["source"]["random_weights"]
    assert {k: m["recipe"][k] for k in EXPECTED[family]} == EXPECTED[family]
    assert m["recipe"]["rescale_factor"] == 1 / 255 and m["recipe"]["exif_transpose"] is True
    assert m["recipe"]["alpha"] == "composite_on_white"
    assert m["embedding"]["image"] == RULES[family] and m["embedding"]["normalized"] is False
    graphs = {"clip": {"image", "text"}}.get(family, {"image"})
    assert set(m["graphs"]) == graphs and set(m["validation"]) == graphs
    for g in graphs:
        assert m["validation"][g]["max_rel"] <= _budget(family, g)
        # the text graph: each batch padded to 77, then cut as the runtime cuts it, each prompt alone
        cases = m["validation"][g]["cases"]
        assert [c["shape"][0] for c in cases] == ([1, 1, 3, 3] if g == "text" else [1, 3])
        if g == "text":
            assert [c.get("cut_to") for c in cases] == [None, [16], None, [16, 32, 16]]
            assert m["graphs"]["text"]["inputs"][0]["shape"] == ["batch", "sequence"]
    assert m["graphs"]["image"]["inputs"][0]["shape"] == ["batch", 3, 224, 224]
    assert m["graphs"]["image"]["outputs"][0]["shape"] == ["batch", m["embedding"]["dim"]]


@pytest.mark.slow
def test_clip_graphs_equal_get_features_unwrapped(bundles):
    import torch

    b, m = _load(bundles["clip-tiny"]), _checkpoint("clip-tiny")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(m.name_or_path)
    enc = tok(
        ["a dog", "a red backpack in the snow", "A CAT"], padding="max_length", max_length=77, return_tensors="np"
    )
    ids, mask = enc["input_ids"].astype(np.int64), enc["attention_mask"].astype(np.int64)
    pv = _pixels(3)
    with torch.no_grad():
        text_out = m.get_text_features(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask))
        image_out = m.get_image_features(pixel_values=torch.from_numpy(pv))
        # transformers 5: an output object whose pooler_output is the projection, not a tensor
        text_feat = text_out if isinstance(text_out, torch.Tensor) else text_out.pooler_output
        image_feat = image_out if isinstance(image_out, torch.Tensor) else image_out.pooler_output
        text_explicit = m.text_projection(
            m.text_model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).pooler_output
        )
        image_explicit = m.visual_projection(m.vision_model(pixel_values=torch.from_numpy(pv)).pooler_output)
    assert text_feat.shape == (3, m.config.projection_dim) and torch.equal(text_feat, text_explicit)
    assert torch.equal(image_feat, image_explicit)
    assert _rel(_run(b, "text", {"input_ids": ids}), text_explicit.numpy()) <= _budget("clip", "text")
    assert _rel(_run(b, "image", {"pixel_values": pv}), image_explicit.numpy()) <= _budget("clip")
    # the manifest's text settings describe the bundle's tokenizer
    assert b.manifest["text"]["max_length"] == 77 and b.manifest["text"]["pad_token_id"] == tok.pad_token_id
    assert json.loads((b.path / "tokenizer.json").read_text())["model"]["type"] == "BPE"


@pytest.mark.slow
def test_dinov2_graph_equals_dinov2_model_at_224(bundles):
    import torch

    b, m = _load(bundles["dinov2-tiny"]), _checkpoint("dinov2-tiny")
    assert m.config.image_size == 518  # the trained 37 x 37 grid: transformers interpolates at 224
    pv = _pixels(3)
    with torch.no_grad():
        want = m(pixel_values=torch.from_numpy(pv)).last_hidden_state[:, 0].numpy()
    assert _rel(_run(b, "image", {"pixel_values": pv}), want) <= _budget("dinov2")


@pytest.mark.slow
@pytest.mark.parametrize("key", ["dino-tiny-s16", "dino-tiny-s8"])
def test_dino_graph_is_the_cls_after_the_final_norm(bundles, key):
    import torch

    b, m = _load(bundles[key]), _checkpoint(key)
    for mod in m.modules():  # DINO's eps (at this weight scale 1e-6 and 1e-12 agree within the budget)
        if isinstance(mod, torch.nn.LayerNorm):
            mod.eps = 1e-6
    pv = _pixels(1)
    with torch.no_grad():
        want = m(pixel_values=torch.from_numpy(pv)).last_hidden_state[:, 0].numpy()
    assert _rel(_run(b, "image", {"pixel_values": pv}), want) <= _budget("dino")


@pytest.mark.slow
def test_dino_export_uses_eps_1e6_not_the_configs_1e12(tmp_path, cache_dir):
    """A DINO checkpoint whose config says 1e-12 (as facebook/dino-vits16's), its embeddings scaled
    so that the LayerNorm inputs' variance is near 1e-6: the graph equals ViTModel with eps 1e-6,
    and differs from ViTModel with the config's 1e-12 by far more than the budget."""
    import torch
    from transformers import ViTModel

    from masc_engine.export.embedders import export_embedder_bundle

    model = random_embedder_model("dino-tiny-s16")
    with torch.no_grad():
        emb = model.embeddings
        for t in (
            emb.patch_embeddings.projection.weight,
            emb.patch_embeddings.projection.bias,
            emb.cls_token,
            emb.position_embeddings,
        ):
            t.mul_(2e-3)
    model.save_pretrained(tmp_path / "ckpt")
    assert json.loads((tmp_path / "ckpt" / "config.json").read_text())["layer_norm_eps"] == 1e-12
    b = _load(export_embedder_bundle(str(tmp_path / "ckpt"), tmp_path / "bundle"))
    assert b.manifest["architecture"]["layer_norm_eps"] == 1e-6
    assert b.manifest["architecture"]["config_layer_norm_eps"] == 1e-12
    pv = _pixels(3)
    got = _run(b, "image", {"pixel_values": pv})
    refs = {}
    for eps in (1e-6, 1e-12):
        m = ViTModel.from_pretrained(tmp_path / "ckpt", layer_norm_eps=eps, add_pooling_layer=False).eval()
        with torch.no_grad():
            refs[eps] = m(pixel_values=torch.from_numpy(pv)).last_hidden_state[:, 0].numpy()
    assert _rel(got, refs[1e-6]) <= _budget("dino")
    assert _rel(got, refs[1e-12]) > 100 * _budget("dino")
