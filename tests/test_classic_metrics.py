"""The classic metrics in masc-run (``--metrics``, ``--embedder``): each column equals 100 x cosine
of transformers' embeddings on the reference pipelines; a run without them is byte-identical to
the run of before; resume and settings checks cover them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from masc_engine.cli.run_cmd import main as run_main
from masc_engine.runtime.pair_metrics import MetricBatch, get_metric
from masc_engine.runtime.pair_metrics.classic import cosine100
from masc_engine.tolerances import CLASSIC_METRIC_ATOL, FLOAT64_SAME_FORMULA_TOL

ROOT = Path(__file__).resolve().parents[1]
PAIRS = ROOT / "examples" / "dreambooth" / "pairs.csv"
KEYS = {"clip": "clip-tiny", "dino": "dino-tiny-s16"}


def test_cosine100_is_100_times_the_cosine_without_clamp():
    a, b = np.array([1.0, 0.0], np.float32), np.array([-3.0, 0.0], np.float32)
    assert cosine100(a, b) == -100.0
    assert cosine100(np.array([1.0, 1.0]), np.array([2.0, 0.0])) == pytest.approx(
        100 / np.sqrt(2), rel=FLOAT64_SAME_FORMULA_TOL
    )


def test_a_missing_embedding_is_nan_with_a_status():
    class Item:
        prompt = "a dog"

    batch = MetricBatch(
        [Item()], [], lambda e: e, 0.5, image_keys=[("r", "o")], embeddings={"clip": {"r": np.ones(3, np.float32)}}
    )
    got = get_metric("clip_i").compute(batch)[0]
    assert np.isnan(got["clip_i"]) and got["status"] == "no_embedding"
    got = get_metric("clip_t").compute(batch)[0]
    assert np.isnan(got["clip_t"]) and got["status"] == "no_embedding"
    batch.embeddings["clip"]["o"] = np.array([1.0, 1.0, -1.0], np.float32)
    assert get_metric("clip_i").compute(batch)[0] == {"clip_i": pytest.approx(100 / 3, rel=FLOAT64_SAME_FORMULA_TOL)}


def _invoke(args):
    res = CliRunner().invoke(run_main, [str(a) for a in args])
    return res.exit_code, res.output


@pytest.fixture(scope="module")
def bundles(embedder_bundles, naflex_bundle):
    """The session's clip and dino bundles (conftest ``embedder_bundles``: one export per preset)."""
    return {k: embedder_bundles[v] for k, v in KEYS.items()}


def _classic_args(bundles) -> list:
    return [
        "--metrics",
        "cp,pf,clip_i,clip_t,dino",
        "--embedder",
        f"clip={bundles['clip']}",
        "--embedder",
        f"dino={bundles['dino']}",
        "--no-progress",
    ]


def _reference_scores(rows: list[dict]) -> dict[str, list[float]]:
    """clip_i, clip_t and dino of each row, from transformers' models (test_embedder_runtime.py's
    reference models: CLIPModel, ViTModel with DINO's eps) on the reference pipelines' pixels."""
    import torch
    from PIL import Image
    from test_embedder_runtime import _reference_model, _reference_pixels
    from transformers import AutoTokenizer

    base = PAIRS.parent
    out: dict[str, list[float]] = {"clip_i": [], "clip_t": [], "dino": []}
    clip, clip_path = _reference_model(KEYS["clip"])
    dino, _ = _reference_model(KEYS["dino"])
    tok = AutoTokenizer.from_pretrained(clip_path)
    with torch.no_grad():
        for r in rows:
            ims = [Image.open(base / r[c]) for c in ("ref_image", "out_image")]
            pv = torch.from_numpy(_reference_pixels(KEYS["clip"], ims))
            ci = clip.visual_projection(clip.vision_model(pixel_values=pv).pooler_output).numpy()
            ids = tok([r["prompt"]], padding="max_length", max_length=77, truncation=True, return_tensors="pt")
            ct = clip.text_projection(clip.text_model(input_ids=ids["input_ids"]).pooler_output).numpy()
            dv = dino(pixel_values=torch.from_numpy(_reference_pixels(KEYS["dino"], ims))).last_hidden_state[:, 0]
            out["clip_i"].append(cosine100(ci[0], ci[1]))
            out["clip_t"].append(cosine100(ci[1], ct[0]))
            out["dino"].append(cosine100(dv[0].numpy(), dv[1].numpy()))
    return out


@pytest.mark.slow
def test_masc_run_writes_the_classic_columns_equal_to_the_reference(bundles, naflex_bundle, tmp_path):
    import csv

    out = tmp_path / "scores.csv"
    code, text = _invoke([PAIRS, "--bundle", naflex_bundle, "--out", out, *_classic_args(bundles)])
    assert code == 0, text
    rows = list(csv.DictReader(out.open()))
    assert list(rows[0])[-6:] == ["clip_i", "clip_i_status", "clip_t", "clip_t_status", "dino", "dino_status"]
    want = _reference_scores(rows)
    for col, values in want.items():
        got = np.array([float(r[col]) for r in rows])
        assert all(r[f"{col}_status"] == "ok" for r in rows)
        assert np.abs(got - np.array(values)).max() <= CLASSIC_METRIC_ATOL, col
    meta = json.loads(Path(f"{out}.meta.json").read_text())
    assert set(meta["embedders"]) == {"clip", "dino"} and meta["settings"]["metrics"] == ["clip_i", "clip_t", "dino"]
    # each column's recipe (scale, clamp, pairing) beside its number
    assert list(meta["column_recipes"]) == ["clip_i", "clip_t", "dino"]
    assert meta["column_recipes"]["dino"]["checkpoint"].startswith("facebook/dino-vits16")
    assert meta["column_recipes"]["clip_t"]["pairing"] == "output <-> its prompt"

    # The same command resumes: nothing is scored again.
    code, text = _invoke([PAIRS, "--bundle", naflex_bundle, "--out", out, *_classic_args(bundles)])
    assert code == 0 and "resumed: 20" in text and "0 images encoded" in text, text
    # Another --metrics on the same output refuses in one line, naming what changed.
    code, text = _invoke(
        [
            PAIRS,
            "--bundle",
            naflex_bundle,
            "--out",
            out,
            "--metrics",
            "cp,pf,clip_i",
            "--embedder",
            f"clip={bundles['clip']}",
            "--no-progress",
        ]
    )
    err = [ln for ln in text.splitlines() if ln.startswith("Error:")]
    assert code == 1 and len(err) == 1 and "--metrics: clip_i,clip_t,dino -> clip_i" in err[0], text


@pytest.mark.slow
def test_a_run_without_metrics_is_byte_identical_to_the_default_run(bundles, naflex_bundle, tmp_path):
    """A default run and a run naming only the always-computed metrics write the same bytes and the
    same fingerprint as the code path without --metrics (RunSettings() through run_pairs)."""
    from masc_engine.jobs.pairs import RunOptions, RunSettings, run_pairs
    from masc_engine.runtime.scorer import Scorer

    plain = tmp_path / "plain.csv"
    run_pairs(PAIRS, Scorer(naflex_bundle), plain, RunSettings(), RunOptions(progress=False))
    for name, extra in (("cli.csv", []), ("named.csv", ["--metrics", "cp,pf"])):
        out = tmp_path / name
        code, text = _invoke([PAIRS, "--bundle", naflex_bundle, "--out", out, "--no-progress", *extra])
        assert code == 0, text
        assert out.read_bytes() == plain.read_bytes()
        fp = [json.loads(Path(f"{p}.meta.json").read_text())["fingerprint"] for p in (plain, out)]
        assert fp[0] == fp[1]
    assert json.loads(Path(f"{plain}.meta.json").read_text())["fingerprint"] == RunSettings().fingerprint(
        Scorer(naflex_bundle)
    )


@pytest.mark.slow
def test_each_embedder_preprocesses_the_file_as_opened(bundles, naflex_bundle):
    """An RGBA PNG: the embedder's pixels are its recipe on the file (alpha composited on white),
    not on the scorer's RGB image (alpha dropped)."""
    import io

    from PIL import Image

    from masc_engine.jobs.items import decode_image
    from masc_engine.runtime.embedder import Embedder
    from masc_engine.runtime.scorer import Scorer

    rgba = Image.new("RGBA", (40, 30), (200, 10, 10, 0))
    rgba.paste((10, 200, 10, 255), (0, 0, 20, 30))
    buf = io.BytesIO()
    rgba.save(buf, "PNG")
    emb = Embedder(bundles["clip"])
    d = decode_image(buf.getvalue(), "x.png", Scorer(naflex_bundle), embedders={"clip": emb})
    np.testing.assert_array_equal(d.embed_pixels["clip"], emb.preprocess_image(Image.open(io.BytesIO(buf.getvalue()))))
    assert not np.array_equal(d.embed_pixels["clip"], emb.preprocess_image(rgba.convert("RGB")))


@pytest.mark.parametrize(
    "args, says",
    [
        (["--metrics", "cp,clip_x"], "--metrics: unknown metric(s) clip_x"),
        (["--metrics", "cp,pf,dino"], "--metrics dino reads the dino embedder: give --embedder dino=BUNDLE"),
        (["--metrics", "clip_i", "--embedder", "siglip=x"], "--embedder siglip=x: expected NAME=BUNDLE"),
    ],
)
def test_a_bad_metric_or_embedder_is_refused_in_one_line_before_any_work(args, says, tmp_path):
    fake_bundle = tmp_path / "bundle"
    fake_bundle.mkdir()
    out = tmp_path / "o.csv"
    code, text = _invoke([PAIRS, "--bundle", fake_bundle, "--out", out, *args])
    assert code == 1 and text.strip().splitlines() == [f"Error: {text.strip().split('Error: ', 1)[1]}"], text
    assert says in text and not out.exists()
    shutil.rmtree(fake_bundle)


# --------------------------------------------------------------------------- clip_score_tm (torchmetrics CLIPScore)

#: Where torchmetrics' rules are read (not installed here: the reference below is written from it).
TORCHMETRICS_SOURCE = (
    "Lightning-AI/torchmetrics 1.9.0 (master dab0333), src/torchmetrics/functional/multimodal/"
    "clip_score.py and src/torchmetrics/multimodal/clip_score.py"
)


def _tm_batch(cosines: list[float]) -> MetricBatch:
    """Rows whose output image and prompt embeddings have the given cosines (2-D unit vectors)."""

    class Item:
        def __init__(self, prompt):
            self.prompt = prompt

    items = [Item(f"p{i}") for i in range(len(cosines))]
    images = {f"o{i}": np.array([1.0, 0.0], np.float32) * (i + 2) for i in range(len(cosines))}
    texts = {f"p{i}": np.array([c, np.sqrt(1 - c * c)], np.float32) for i, c in enumerate(cosines)}
    return MetricBatch(
        items,
        [],
        lambda e: e,
        0.5,
        image_keys=[("r", f"o{i}") for i in range(len(cosines))],
        embeddings={"clip_l14": images},
        text_embeddings={"clip_l14": texts},
    )


@pytest.mark.parametrize(
    "cosines, aggregate",
    [
        ([-0.6, 0.2, 0.1], 0.0),  # mean -10: clamped to 0 (a per-row clamp would give 10)
        ([-0.2, 0.5], 15.0),  # mean 15 (a per-row clamp would give 25)
        ([0.3, 0.1], 20.0),
    ],
)
def test_clip_score_tm_rows_are_unclamped_and_the_clamp_is_on_the_mean(cosines, aggregate):
    """torchmetrics: per sample ``100 * cos`` (no clamp), then ``max(mean, 0)`` on the mean."""
    from masc_engine.runtime.pair_metrics.classic import clip_score_tm_aggregate

    got = [r["clip_score_tm"] for r in get_metric("clip_score_tm").compute(_tm_batch(cosines))]
    np.testing.assert_allclose(got, 100 * np.array(cosines), atol=CLASSIC_METRIC_ATOL)
    assert clip_score_tm_aggregate(got) == pytest.approx(aggregate, abs=CLASSIC_METRIC_ATOL)
    assert clip_score_tm_aggregate(got + [float("nan")]) == clip_score_tm_aggregate(got)  # a NaN row is not a sample
    assert np.isnan(clip_score_tm_aggregate([float("nan")]))


def test_clip_score_tm_reads_the_l14_embedder_and_records_its_recipe():
    from masc_engine.runtime.pair_metrics.classic import COLUMN_RECIPES, EMBEDDER_OF
    from masc_engine.runtime.recipes import CLIP_B32_DREAMBENCH, NAMED_RECIPES

    m = get_metric("clip_score_tm")
    assert EMBEDDER_OF["clip_score_tm"] == "clip_l14" and m.encoders == ("clip_l14.image", "clip_l14.text")
    assert m.option == "classic" and m.output_columns() == ("clip_score_tm", "clip_score_tm_status")
    r = COLUMN_RECIPES["clip_score_tm"]
    assert r["checkpoint"].startswith("openai/clip-vit-large-patch14") and "mean" in r["clamp"]
    # Same pixels as DreamBench++'s CLIP recipe (L/14's preprocessor_config has B/32's values).
    tm = NAMED_RECIPES[r["image_recipe"]].to_manifest()
    b32 = CLIP_B32_DREAMBENCH.to_manifest()
    assert {k: v for k, v in tm.items() if k != "follows"} == {k: v for k, v in b32.items() if k != "follows"}
    from masc_engine.runtime.pair_metrics import registered

    assert {m.name for m in registered() if m.option == "classic"} == set(COLUMN_RECIPES)


def _torchmetrics_reference(path, images, prompts) -> np.ndarray:
    """Per-sample CLIPScore as torchmetrics computes it (:data:`TORCHMETRICS_SOURCE`,
    ``_get_features`` and ``_clip_score_update``), on random weights: ``CLIPProcessor`` on
    ``[C, H, W]`` uint8 tensors; text ``padding=True``, ids and mask cut at
    ``max_position_embeddings``; ``get_image_features`` / ``get_text_features`` with transformers
    5's output object unwrapped (``pooler_output``); L2-normalised; ``100 * sum(a * b)``."""
    import torch
    from transformers import CLIPModel, CLIPProcessor

    model, processor = CLIPModel.from_pretrained(path).eval(), CLIPProcessor.from_pretrained(path)
    tensors = [torch.from_numpy(np.asarray(im)).permute(2, 0, 1).contiguous() for im in images]
    with torch.no_grad():
        processed = processor(images=[i.cpu() for i in tensors], return_tensors="pt", padding=True)
        img = model.get_image_features(processed["pixel_values"])
        img = getattr(img, "pooler_output", None) if not isinstance(img, torch.Tensor) else img
        processed = processor(text=prompts, return_tensors="pt", padding=True)
        n = model.config.text_config.max_position_embeddings
        ids, mask = processed["input_ids"][..., :n], processed["attention_mask"][..., :n]
        txt = model.get_text_features(ids, mask)
        txt = getattr(txt, "pooler_output", None) if not isinstance(txt, torch.Tensor) else txt
        img = img / img.norm(p=2, dim=-1, keepdim=True)
        txt = txt / txt.norm(p=2, dim=-1, keepdim=True)
        return (100 * (img * txt).sum(axis=-1)).numpy().astype(np.float64)


@pytest.fixture(scope="module")
def l14_bundle(embedder_bundles, naflex_bundle):
    """The session's clip-tiny-l14 bundle (conftest ``embedder_bundles``)."""
    return embedder_bundles["clip-tiny-l14"]


@pytest.mark.slow
def test_masc_run_clip_score_tm_equals_torchmetrics_rules(l14_bundle, naflex_bundle, tmp_path):
    """The column equals the torchmetrics reference per row, and its aggregate torchmetrics' clamped
    mean, on the 20 example pairs (the images as a torchmetrics user decodes them: EXIF-oriented
    RGB, as the recipe loads them)."""
    import csv

    from PIL import Image, ImageOps

    from masc_engine.export.checkpoint import random_checkpoint_dir
    from masc_engine.runtime.pair_metrics.classic import clip_score_tm_aggregate

    out = tmp_path / "scores.csv"
    code, text = _invoke(
        [
            PAIRS,
            "--bundle",
            naflex_bundle,
            "--out",
            out,
            "--metrics",
            "cp,pf,clip_score_tm",
            "--embedder",
            f"clip_l14={l14_bundle}",
            "--no-progress",
        ]
    )
    assert code == 0, text
    rows = list(csv.DictReader(out.open()))
    assert list(rows[0])[-2:] == ["clip_score_tm", "clip_score_tm_status"]
    assert all(r["clip_score_tm_status"] == "ok" for r in rows)
    got = np.array([float(r["clip_score_tm"]) for r in rows])
    images = [ImageOps.exif_transpose(Image.open(PAIRS.parent / r["out_image"])).convert("RGB") for r in rows]
    want = _torchmetrics_reference(random_checkpoint_dir("random:clip-tiny-l14"), images, [r["prompt"] for r in rows])
    print(f"clip_score_tm max |delta| vs torchmetrics rules: {np.abs(got - want).max():.3g}")
    assert np.abs(got - want).max() <= CLASSIC_METRIC_ATOL
    assert clip_score_tm_aggregate(got) == pytest.approx(max(float(want.mean()), 0.0), abs=CLASSIC_METRIC_ATOL)
    meta = json.loads(Path(f"{out}.meta.json").read_text())
    assert set(meta["embedders"]) == {"clip_l14"} and meta["settings"]["metrics"] == ["clip_score_tm"]
    assert meta["column_recipes"]["clip_score_tm"]["clamp"].startswith("max(mean, 0) on the mean")
    # the sidecar records the bundle's recipe: the torchmetrics pipeline, the clip_score_tm recipe's pixels
    from masc_engine.runtime.recipes import CLIP_L14_TORCHMETRICS

    assert meta["embedders"]["clip_l14"]["recipe"] == CLIP_L14_TORCHMETRICS.to_manifest()
