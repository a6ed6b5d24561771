"""The embedder runtime (runtime/embedder.py) on tiny fake embedder bundles made here with
onnx.helper: the manifest's recipe decides the pixels, the graphs' outputs come back in order and
unbatched-equal, texts are tokenized as CLIP's tokenizer does (start/end of text, padding and
truncation at 77).

The image graph is ``top-left 8 x 8 pixels, flattened, @ W`` (``[N, 3, H, W] -> [N, D]``) and the text graph
``sum over tokens of table[ids] * attention_mask`` (``[N, 77] -> [N, D]``), so the expected
embeddings are computed here in numpy from the preprocessed pixels and token ids.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from masc_engine.engine.manifest import write_manifest
from masc_engine.errors import BundleError
from masc_engine.runtime.embedder import RECIPE_KEY, Embedder, text_run_lengths
from masc_engine.runtime.recipes import CLIP_B32_DREAMBENCH, DINO_V1_EVAL, DINOV2_HF, RecipeError, preprocess
from masc_engine.tolerances import EMBEDDER_RUNTIME_FAKE_RTOL

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
pytest.importorskip("tokenizers")

DIM = 8
#: The image graph reads the top-left PATCH x PATCH pixels of the crop.
PATCH = 8
CONTEXT = 77
WORDS = ["a", "photo", "of", "dog", "cat", "on", "the", "beach", "red", "backpack"]
BOS, EOS = "<|startoftext|>", "<|endoftext|>"


def _tokenizer_json(path: Path) -> dict:
    """A word-level tokenizer with CLIP's special tokens and post-processor (``BOS $A EOS``); the
    pad token is the end-of-text token, as in openai/clip-vit-base-patch32."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {BOS: 0, EOS: 1, "[UNK]": 2, **{w: i + 3 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A {EOS}", special_tokens=[(BOS, 0), (EOS, 1)])
    tok.save(str(path))
    return vocab


def _image_graph(w: np.ndarray, name: str = "pixel_values"):
    """``pixel_values[:, :, :P, :P]`` flattened (channel, row, column) ``@ W``: every output depends on
    where the crop starts, so a one-pixel shift of the recipe changes it."""
    from onnx import TensorProto, helper, numpy_helper

    consts = {"starts": [0, 0], "ends": [PATCH, PATCH], "axes": [2, 3], "flat": [0, 3 * PATCH * PATCH]}
    nodes = [
        helper.make_node("Slice", [name, "starts", "ends", "axes"], ["corner"]),
        helper.make_node("Reshape", ["corner", "flat"], ["row"]),
        helper.make_node("MatMul", ["row", "W"], ["image_embeds"]),
    ]
    graph = helper.make_graph(
        nodes,
        "image",
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", 3, "h", "w"])],
        [helper.make_tensor_value_info("image_embeds", TensorProto.FLOAT, ["batch", DIM])],
        initializer=[numpy_helper.from_array(w, "W")]
        + [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in consts.items()],
    )
    return graph


def _text_graph(table: np.ndarray, names: tuple[str, ...], sequence: int | str = CONTEXT):
    """``sum over tokens of table[input_ids]`` (times ``attention_mask`` when it is an input)."""
    from onnx import TensorProto, helper, numpy_helper

    nodes = [helper.make_node("Gather", ["table", "input_ids"], ["rows"])]
    if "attention_mask" in names:
        nodes += [
            helper.make_node("Cast", ["attention_mask"], ["maskf"], to=TensorProto.FLOAT),
            helper.make_node("Unsqueeze", ["maskf", "last"], ["mask3"]),
            helper.make_node("Mul", ["rows", "mask3"], ["kept"]),
        ]
    nodes.append(helper.make_node("ReduceSum", [nodes[-1].output[0], "tokens"], ["text_embeds"], keepdims=0))
    ids = [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", sequence]) for n in names]
    graph = helper.make_graph(
        nodes,
        "text",
        ids,
        [helper.make_tensor_value_info("text_embeds", TensorProto.FLOAT, ["batch", DIM])],
        initializer=[
            numpy_helper.from_array(table, "table"),
            numpy_helper.from_array(np.array([-1], np.int64), "last"),
            numpy_helper.from_array(np.array([1], np.int64), "tokens"),
        ],
    )
    return graph


def _save(graph, path: Path) -> None:
    from onnx import helper

    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def make_fake_embedder(
    out: Path,
    recipe=CLIP_B32_DREAMBENCH,
    text: bool = True,
    seed: int = 0,
    text_inputs: tuple[str, ...] = ("input_ids",),
    image_input: str = "pixel_values",
    pooling: str | None = None,
) -> dict:
    """Write a fake embedder bundle into ``out`` (the manifest layout of export/embedders.py: ``recipe``,
    ``embedding``, ``source.model``, the ``text`` section); returns the weights (``W``, ``table``,
    ``vocab``). ``text_inputs``: the text graph's inputs (the CLIP export's is ``input_ids`` alone);
    ``pooling``: the text section's pooling rule, and the text graph's sequence axis dynamic."""
    rng = np.random.default_rng(seed)
    out.mkdir(parents=True, exist_ok=True)
    w = rng.standard_normal((3 * PATCH * PATCH, DIM)).astype(np.float32)
    _save(_image_graph(w, image_input), out / "image.onnx")
    graphs = {
        "image": {
            "file": "image.onnx",
            "inputs": [{"name": image_input, "shape": ["batch", 3, "h", "w"]}],
            "outputs": [{"name": "image_embeds", "shape": ["batch", DIM]}],
        }
    }
    weights = {"W": w}
    manifest = {
        "kind": "embedder",
        "source": {"model": "fake", "random_weights": False},
        RECIPE_KEY: recipe.to_manifest(),
        "embedding": {
            "image": "cls_layernorm",
            "text": "clip_text_projection" if text else None,
            "dim": DIM,
            "normalized": False,
        },
        "graphs": graphs,
        "precision": {"mode": "fp32"},
        "files": ["image.onnx"],
    }
    if text:
        weights["vocab"] = _tokenizer_json(out / "tokenizer.json")
        weights["table"] = table = rng.standard_normal((len(weights["vocab"]), DIM)).astype(np.float32)
        sequence = "sequence" if pooling else CONTEXT
        _save(_text_graph(table, text_inputs, sequence), out / "text.onnx")
        graphs["text"] = {
            "file": "text.onnx",
            "inputs": [{"name": n, "shape": ["batch", sequence]} for n in text_inputs],
            "outputs": [{"name": "text_embeds", "shape": ["batch", DIM]}],
        }
        manifest["text"] = {
            "tokenizer_file": "tokenizer.json",
            "max_length": CONTEXT,
            "padding_side": "right",
            "truncation_side": "right",
            "pad_token": EOS,
            "pad_token_id": 1,
            "vocab_size": len(weights["vocab"]),
        }
        if pooling:
            manifest["text"].update(pooling=pooling, eos_token_id=1)
        manifest["files"] += ["text.onnx", "tokenizer.json"]
    write_manifest(out, manifest)
    return weights


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    out = tmp_path_factory.mktemp("embedder") / "bundle"
    return out, make_fake_embedder(out)


def _images() -> list[Image.Image]:
    rng = np.random.default_rng(5)
    ims = [
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
        for h, w in [(333, 517), (640, 427), (224, 224)]
    ]
    rgba = rng.integers(0, 256, (300, 200, 4), dtype=np.uint8)
    return ims + [Image.fromarray(rgba, "RGBA")]


def _rel(got, want) -> float:
    """max |got - want| / max |want|."""
    return float(np.abs(np.asarray(got, np.float64) - want).max() / np.abs(want).max())


def _expected_image(images, recipe, w) -> np.ndarray:
    return np.stack([preprocess(im, recipe)[:, :PATCH, :PATCH].astype(np.float64).reshape(-1) @ w for im in images])


# ---------------------------------------------------------------------------------- images


def test_image_embeddings_follow_the_manifest_recipe(fake):
    path, weights = fake
    ims = _images()
    with Embedder(path, batch_size=3) as e:
        assert e.recipe == CLIP_B32_DREAMBENCH
        got = e.embed_images(ims)
    assert got.dtype == np.float32 and got.shape == (len(ims), DIM)
    assert _rel(got, _expected_image(ims, CLIP_B32_DREAMBENCH, weights["W"])) <= EMBEDDER_RUNTIME_FAKE_RTOL
    for other in (DINO_V1_EVAL, DINOV2_HF, replace(CLIP_B32_DREAMBENCH, crop_rounding="torchvision_round")):
        assert _rel(got, _expected_image(ims, other, weights["W"])) > 1000 * EMBEDDER_RUNTIME_FAKE_RTOL


@pytest.mark.parametrize("recipe", [DINO_V1_EVAL, DINOV2_HF], ids=["dino_v1", "dinov2"])
def test_other_recipes_are_read_from_the_manifest(tmp_path, recipe):
    weights = make_fake_embedder(tmp_path / "b", recipe=recipe, text=False)
    ims = _images()[:2]
    with Embedder(tmp_path / "b") as e:
        assert e.recipe == recipe and not e.has_text
        got = e.embed_images(ims)
    assert _rel(got, _expected_image(ims, recipe, weights["W"])) <= EMBEDDER_RUNTIME_FAKE_RTOL


def test_image_input_of_another_name(tmp_path):
    weights = make_fake_embedder(tmp_path / "b", text=False, image_input="images")
    ims = _images()[:2]
    with Embedder(tmp_path / "b") as e:
        got = e.embed_images(ims)
    assert _rel(got, _expected_image(ims, CLIP_B32_DREAMBENCH, weights["W"])) <= EMBEDDER_RUNTIME_FAKE_RTOL


def test_batching_does_not_change_an_embedding(fake):
    path, _ = fake
    ims = _images()
    with Embedder(path, batch_size=1) as one, Embedder(path, batch_size=4) as four:
        np.testing.assert_array_equal(one.embed_images(ims), four.embed_images(ims))
        np.testing.assert_array_equal(four.embed_images(ims[::-1]), four.embed_images(ims)[::-1])
        assert four.embed_images([]).shape == (0, DIM)


def test_uncropped_recipe_batches_by_shape(tmp_path):
    recipe = replace(DINOV2_HF, crop_size=None)
    weights = make_fake_embedder(tmp_path / "b", recipe=recipe, text=False)
    ims = _images()  # four shapes after the resize
    with Embedder(tmp_path / "b", batch_size=8) as e:
        got = e.embed_images(ims)
    assert _rel(got, _expected_image(ims, recipe, weights["W"])) <= EMBEDDER_RUNTIME_FAKE_RTOL


# ---------------------------------------------------------------------------------- texts


def _ids(vocab, words):
    return [vocab[BOS]] + [vocab[w] for w in words] + [vocab[EOS]]


def test_text_ids_padded_and_truncated_at_77(fake):
    path, weights = fake
    vocab = weights["vocab"]
    long_words = (WORDS * 10)[:100]
    with Embedder(path) as e:
        ids, mask = e.tokenize(["a photo of a dog", " ".join(long_words)])
    assert ids.dtype == np.int64 and ids.shape == mask.shape == (2, CONTEXT)
    short = _ids(vocab, "a photo of a dog".split())
    assert ids[0].tolist() == short + [vocab[EOS]] * (CONTEXT - len(short))
    assert mask[0].tolist() == [1] * len(short) + [0] * (CONTEXT - len(short))
    # truncated to the context with the end-of-text token kept last (75 words between BOS and EOS)
    assert ids[1].tolist() == _ids(vocab, long_words[: CONTEXT - 2]) and mask[1].all()


@pytest.mark.parametrize("inputs", [("input_ids",), ("input_ids", "attention_mask")], ids=["ids", "ids+mask"])
def test_text_embeddings(tmp_path, inputs):
    weights = make_fake_embedder(tmp_path / "b", text_inputs=inputs)
    texts = ["a photo of a dog", "a red backpack on the beach", "cat"]
    with Embedder(tmp_path / "b", batch_size=2) as e:
        got = e.embed_texts(texts)
        ids, mask = e.tokenize(texts)
        assert e.embed_texts([]).shape == (0, DIM)
    if "attention_mask" not in inputs:
        mask = np.ones_like(mask)  # padding (end-of-text tokens) is summed too
    want = (weights["table"][ids].astype(np.float64) * mask[..., None]).sum(axis=1)
    assert got.dtype == np.float32 and got.shape == (3, DIM)
    assert _rel(got, want) <= EMBEDDER_RUNTIME_FAKE_RTOL


def test_text_run_lengths_follow_the_pooling_rule():
    ids = np.full((4, CONTEXT), 5, np.int64)
    for row, eos in enumerate((3, 15, 16, 76)):
        ids[row, eos:] = 9  # the end-of-text token is the largest id and pads the rest (CLIP)
    legacy = {"pooling": "argmax of input_ids (legacy eos_token_id 2)"}
    assert text_run_lengths(ids, legacy).tolist() == [16, 16, 32, 77]
    first = {"pooling": "first eos_token_id", "eos_token_id": 9}
    assert text_run_lengths(ids, first).tolist() == [16, 16, 32, 77]
    ids[0, 20] = 11  # a larger id later: the legacy rule reads that token, so the run keeps it
    assert text_run_lengths(ids, legacy)[0] == 32 and text_run_lengths(ids, first)[0] == 16
    # no end-of-text token: transformers' argmax of an all-False row reads token 0
    assert text_run_lengths(np.full((1, CONTEXT), 5, np.int64), first).tolist() == [16]
    for unknown in ({}, {"pooling": "mean"}, {"pooling": "first eos_token_id"}, {**first, "eos_token_id": True}):
        assert text_run_lengths(ids, unknown).tolist() == [CONTEXT] * 4


@pytest.mark.parametrize("inputs", [("input_ids",), ("input_ids", "attention_mask")], ids=["ids", "ids+mask"])
def test_a_dynamic_text_graph_runs_each_prompt_cut_after_its_pooled_token(tmp_path, inputs):
    """The fake text graph sums every token it is given, padding included: the sums show exactly
    how many tokens each prompt ran with."""
    weights = make_fake_embedder(tmp_path / "b", text_inputs=inputs, pooling="first eos_token_id")
    texts = ["a photo of a dog", " ".join(["dog"] * 20), "cat", " ".join(["cat"] * 100)]
    with Embedder(tmp_path / "b", batch_size=3) as e:
        assert e.text_sequence_dynamic
        got = e.embed_texts(texts)
        ids, mask = e.tokenize(texts)
        alone = np.concatenate([e.embed_texts([t]) for t in texts])
    assert [int(m.sum()) for m in mask] == [7, 22, 3, CONTEXT]
    cut = [16, 32, 16, CONTEXT]
    if "attention_mask" not in inputs:
        mask = np.ones_like(mask)
    want = np.stack([(weights["table"][ids[i, :n]] * mask[i, :n, None]).sum(axis=0) for i, n in enumerate(cut)])
    # a prompt's run length is its own: alone or beside longer ones, the same tokens are summed
    assert _rel(got, want) <= EMBEDDER_RUNTIME_FAKE_RTOL and _rel(alone, want) <= EMBEDDER_RUNTIME_FAKE_RTOL


def test_clip_tokenizer_parity(tmp_path):
    """Against transformers' CLIPTokenizer (a tiny trained CLIP BPE, export/random_models.py) with
    ``padding="max_length", max_length=77, truncation=True``: the same ids."""
    pytest.importorskip("transformers")
    from masc_engine.export.random_models import _train_clip_tokenizer
    from masc_engine.runtime.text import PromptTokenizer, TextSettings

    tok = _train_clip_tokenizer(tmp_path / "tok")
    settings = TextSettings("tokenizer.json", CONTEXT, "right", "right", int(tok.pad_token_id), str(tok.pad_token))
    ours = PromptTokenizer(tmp_path / "tok" / "tokenizer.json", settings)
    texts = ["a photo of a dog", "A RED backpack,  on the beach!", "dog " * 120, ""]
    ref = tok(texts, padding="max_length", max_length=CONTEXT, truncation=True)["input_ids"]
    got = [e.input_ids.tolist() for e in ours.encode(texts)]
    assert got == ref
    assert got[2][0] == tok.bos_token_id and got[2][-1] == tok.eos_token_id


# ---------------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("field,value", [("crop_rounding", "ceil"), ("crop_size", [224, 257]), ("follows", 3)])
def test_bad_recipe_refused_in_one_line(tmp_path, field, value):
    """Refused at load (by the bundle reader's checks or the recipe's own, both BundleError), in one
    line naming the field; a crop larger than the resize is the recipe's own refusal."""
    make_fake_embedder(tmp_path / "b", text=False)
    m = json.loads((tmp_path / "b" / "manifest.json").read_text())
    m[RECIPE_KEY][field] = value
    (tmp_path / "b" / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(BundleError) as e:
        Embedder(tmp_path / "b")
    assert "\n" not in str(e.value) and field in str(e.value)
    if field == "crop_size":
        assert isinstance(e.value, RecipeError)


def test_identity_names_the_recipe(fake):
    path, _ = fake
    with Embedder(path) as e:
        ident = e.identity()
        assert ident["recipe"] == CLIP_B32_DREAMBENCH.to_manifest() and ident["fingerprint"] == e.bundle.fingerprint
        assert e.dim == DIM and e.has_text


def test_image_only_bundle_refuses_texts(tmp_path):
    make_fake_embedder(tmp_path / "b", text=False)
    with Embedder(tmp_path / "b") as e, pytest.raises(BundleError, match="no text graph"):
        e.embed_texts(["a dog"])


def test_text_graph_with_an_unknown_input_refused(tmp_path):
    make_fake_embedder(tmp_path / "b", text_inputs=("input_ids", "position_ids"))
    with Embedder(tmp_path / "b") as e, pytest.raises(BundleError) as err:
        e.embed_texts(["a dog"])
    assert "\n" not in str(err.value) and "position_ids" in str(err.value)


def test_other_kind_refused(tmp_path):
    make_fake_embedder(tmp_path / "b", text=False)
    m = json.loads((tmp_path / "b" / "manifest.json").read_text())
    m["kind"] = "segmenter"
    (tmp_path / "b" / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(BundleError, match="not a embedder bundle|not an embedder bundle"):
        Embedder(tmp_path / "b")


# ---------------------------------------------------------------------------------- exported bundles
# The tiny random presets exported by masc-export (export/embedders.py), against transformers on the
# reference pipelines: the whole chain (recipe, tokenizer, graph) within the export's budgets.

FAMILIES = {"clip-tiny": "clip", "dino-tiny-s16": "dino", "dinov2-tiny": "dinov2"}


@pytest.fixture(scope="module")
def exported(embedder_bundles):
    """Each family's tiny preset, exported once per run (conftest ``embedder_bundles``)."""
    return {k: embedder_bundles[k] for k in FAMILIES}


def _reference_model(key: str):
    from transformers import AutoConfig, AutoModel, ViTModel

    from masc_engine.export.checkpoint import random_checkpoint_dir

    path = random_checkpoint_dir(f"random:{key}")
    if FAMILIES[key] == "dino":  # DINO's LayerNorm eps (facebookresearch/dino vision_transformer.py)
        config = AutoConfig.from_pretrained(path)
        config.layer_norm_eps = 1e-6
        return ViTModel.from_pretrained(path, config=config, add_pooling_layer=False).eval(), path
    return AutoModel.from_pretrained(path).eval(), path


def _reference_pixels(key: str, images) -> np.ndarray:
    """The reference pipelines' pixels: transformers' PIL processors (CLIP, DINOv2) on the EXIF-
    oriented image; torchvision's rules for DINO (tests/test_recipes.py ``torchvision_reference``)."""
    from PIL import ImageOps
    from test_recipes import _hf_processors, torchvision_reference

    if FAMILIES[key] == "dino":
        return np.stack([torchvision_reference(im)[1] for im in images])
    proc = _hf_processors()["clip" if FAMILIES[key] == "clip" else "dinov2"][0]
    return proc(images=[ImageOps.exif_transpose(im) for im in images], return_tensors="np")["pixel_values"]


@pytest.mark.slow
@pytest.mark.parametrize("key", sorted(FAMILIES))
def test_exported_bundle_equals_reference_pipeline(exported, key):
    import torch

    from masc_engine.tolerances import embedder_validation_budget
    from test_recipes import IMAGES

    images = [IMAGES[n] for n in ("333x517", "exif6", "rgba", "palette_transparent")]
    model, path = _reference_model(key)
    pv = torch.from_numpy(_reference_pixels(key, images))
    with Embedder(exported[key], batch_size=3) as e, torch.no_grad():
        got = e.embed_images(images)
        if FAMILIES[key] == "clip":
            want = model.visual_projection(model.vision_model(pixel_values=pv).pooler_output).numpy()
        else:
            want = model(pixel_values=pv).last_hidden_state[:, 0].numpy()
        width = int(e.bundle.manifest["architecture"]["vision_width"])
        assert got.shape == want.shape == (len(images), e.dim)
        assert _rel(got, want) <= embedder_validation_budget(FAMILIES[key], "image", width)[0]
        if FAMILIES[key] != "clip":
            return
        from transformers import AutoTokenizer

        texts = ["a photo of a dog", "A RED backpack on the beach", "dog " * 100]
        ids = AutoTokenizer.from_pretrained(path)(
            texts, padding="max_length", max_length=77, truncation=True, return_tensors="pt"
        )["input_ids"]
        np.testing.assert_array_equal(e.tokenize(texts)[0], ids.numpy())
        want_t = model.text_projection(model.text_model(input_ids=ids).pooler_output).numpy()
        got_t = e.embed_texts(texts)  # the graph's sequence axis is dynamic: run cut after end-of-text
        assert e.text_sequence_dynamic
        assert _rel(got_t, want_t) <= embedder_validation_budget("clip", "text", width)[0]


def test_the_bundle_fingerprint_covers_the_recipe_and_the_embedding_rule():
    """An embedder's preprocessing and pooling are manifest data, not files: editing either makes
    another bundle (cached embeddings and resumed results keyed on the fingerprint are not reused);
    the other kinds keep the fingerprint they had (a segmenter's own ``recipe`` does not enter)."""
    from masc_engine.engine.manifest import fingerprint

    base = {
        "kind": "embedder",
        "files": {"image.onnx": "ab"},
        "recipe": {"size": 224},
        "embedding": {"image": "cls_final_norm"},
    }
    assert fingerprint({**base, "recipe": {"size": 256}}) != fingerprint(base)
    assert fingerprint({**base, "embedding": {"image": "cls_layernorm"}}) != fingerprint(base)
    seg = {"kind": "segmenter", "files": {"vision.onnx": "ab"}, "recipe": {"threshold": 0.5}}
    assert fingerprint({**seg, "recipe": {"threshold": 0.4}}) == fingerprint(seg)
