"""masc-rank (Finer-Personalization Rank): AP/CMC core, similarities, the ONNX encoder manifest,
and the job on the real DreamBooth galleries (examples/dreambooth, the shared set when present; oracle mode)."""

from __future__ import annotations

import csv
import json
import math
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from support import EXAMPLES, photo_sets
from masc_engine.cli.rank_cmd import main as rank_main
from masc_engine.jobs import rank, rank_encoders
from masc_engine.jobs.rank_encoders import EncoderManifestError, cosine_scores, maxcos_scores
from masc_engine.metrics.retrieval import average_precision, cmc, cmc_at, first_correct_rank, rank_query, summarize
from masc_engine.runtime import heads
from masc_engine.runtime.masks import cp_keep
from masc_engine.tolerances import (
    BATCH_INVARIANCE_ATOL,
    FLOAT32_SAME_ARITHMETIC_ATOL,
    FLOAT64_SAME_FORMULA_TOL,
    MAXCOS_BLOCK_ATOL,
    SELF_CP_ATOL,
)


# ====================================================================== AP / CMC core


def _ap_with_order(scores, relevant, relevant_first: bool) -> float:
    """AP with ties broken optimistically (relevant first) or pessimistically, by brute force."""
    items = sorted(zip(scores, relevant), key=lambda t: (-t[0], (not t[1]) if relevant_first else t[1]))
    hits, precisions = 0, []
    for i, (_, r) in enumerate(items, start=1):
        if r:
            hits += 1
            precisions.append(hits / i)
    return sum(precisions) / len(precisions)


@pytest.mark.parametrize(
    "scores, relevant, ap, first",
    [
        ([0.9, 0.8, 0.7, 0.6], [1, 0, 1, 0], (1 + 2 / 3) / 2, 1),
        ([0.9, 0.8, 0.7, 0.6], [0, 1, 0, 1], (1 / 2 + 2 / 4) / 2, 2),
        ([0.6, 0.7, 0.8, 0.9], [1, 0, 0, 0], 1 / 4, 4),  # input order is irrelevant
        ([0.3, 0.2, 0.1], [1, 1, 1], 1.0, 1),
        ([0.5, float("-inf"), 0.4], [0, 1, 0], 1 / 3, 3),  # -inf is a valid (lowest) score
        # ties, pessimistic: among equal scores the irrelevant items come first
        ([0.5, 0.5, 0.5], [1, 0, 0], 1 / 3, 3),
        ([0.9, 0.5, 0.5, 0.1], [0, 1, 0, 1], (1 / 3 + 2 / 4) / 2, 3),
        ([0.7, 0.7, 0.2, 0.2], [1, 1, 0, 1], (1 + 1 + 3 / 4) / 3, 1),  # a tie within the relevant changes nothing
        ([0.4, 0.4], [1, 1], 1.0, 1),
    ],
)
def test_average_precision_known_values(scores, relevant, ap, first):
    assert average_precision(scores, relevant) == pytest.approx(ap, abs=FLOAT64_SAME_FORMULA_TOL)
    assert first_correct_rank(scores, relevant) == first
    r = rank_query(scores, relevant)
    assert r.ap == pytest.approx(ap, abs=FLOAT64_SAME_FORMULA_TOL) and r.first_rank == first
    assert r.n_relevant == sum(relevant) and r.n_gallery == len(scores)


def test_top_k_counts_a_first_correct_rank_of_exactly_k():
    r = rank_query([0.9, 0.8, 0.7, 0.1], [0, 0, 1, 0])
    assert r.first_rank == 3
    assert (r.top(2), r.top(3), r.top(4)) == (False, True, True)


def test_query_without_relevant_item_is_undefined_not_zero():
    assert math.isnan(average_precision([0.9, 0.1], [0, 0]))
    assert first_correct_rank([0.9, 0.1], [0, 0]) is None
    r = rank_query([0.9, 0.1], [0, 0])
    assert not r.defined and r.top(1) is None and r.top_index == 0
    assert math.isnan(average_precision([], []))


def test_bad_core_inputs_are_refused():
    with pytest.raises(ValueError, match="NaN"):
        average_precision([0.1, float("nan")], [1, 0])
    with pytest.raises(ValueError, match="length"):
        average_precision([0.1, 0.2], [1])


def test_ties_are_independent_of_order_and_pessimistic():
    """Under any permutation the AP is the same, and equals the brute-force pessimistic order,
    which is <= the optimistic order and <= sklearn's (sklearn credits every relevant item of a
    tied group with the precision at the group's end, which can exceed even the optimistic order:
    scores 3,3,2,2,1,1,0,0 with relevant 0,0,1,0,1,1,1,1 give sklearn 0.5, optimistic 0.486)."""
    sk = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(0)
    for _ in range(300):
        n = int(rng.integers(2, 15))
        scores = rng.integers(0, 4, n).astype(float)  # many ties
        relevant = rng.random(n) < 0.4
        if not relevant.any():
            relevant[int(rng.integers(n))] = True
        ap = average_precision(scores, relevant)
        perm = rng.permutation(n)
        assert average_precision(scores[perm], relevant[perm]) == ap
        assert ap == pytest.approx(
            _ap_with_order(list(scores), list(relevant), relevant_first=False), abs=FLOAT64_SAME_FORMULA_TOL
        )
        optimistic = _ap_with_order(list(scores), list(relevant), relevant_first=True)
        if relevant.all():
            continue  # sklearn warns and its value is trivially 1
        sk_ap = sk.average_precision_score(relevant, scores)
        assert ap <= optimistic + FLOAT64_SAME_FORMULA_TOL and ap <= sk_ap + FLOAT64_SAME_FORMULA_TOL


def test_average_precision_equals_sklearn_without_ties():
    sk = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(1)
    for _ in range(300):
        n = int(rng.integers(2, 60))
        scores = rng.normal(size=n)
        assert len(np.unique(scores)) == n
        relevant = rng.random(n) < rng.uniform(0.05, 0.8)
        i, j = rng.choice(n, 2, replace=False)
        relevant[i], relevant[j] = True, False  # at least one of each
        assert average_precision(scores, relevant) == pytest.approx(
            sk.average_precision_score(relevant, scores), abs=FLOAT64_SAME_FORMULA_TOL
        )


def test_cmc_curve():
    ranks = [1, 3, None, 2]
    np.testing.assert_allclose(cmc(ranks, 4), [1 / 3, 2 / 3, 1.0, 1.0])
    assert cmc_at(ranks, 1) == pytest.approx(1 / 3) and cmc_at(ranks, 5) == 1.0
    assert np.isnan(cmc([None], 3)).all()
    with pytest.raises(ValueError):
        cmc([0], 2)


def test_summarize_groups_and_excludes_undefined():
    rows = [
        {"method": "a", "class": "dog", "status": "ok", "ap": 1.0, "first_rank": 1},
        {"method": "a", "class": "dog", "status": "ok", "ap": 0.5, "first_rank": 2},
        {"method": "a", "class": "cat", "status": "ok", "ap": 0.25, "first_rank": 6},
        {"method": "a", "class": "cat", "status": "no_relevant_gallery_item", "ap": float("nan"), "first_rank": None},
        {"method": "b", "class": "dog", "status": "missing_file", "ap": float("nan"), "first_rank": None},
    ]
    s = {(r["method"], r["class"]): r for r in summarize(rows)}
    assert set(s) == {
        ("a", "cat"),
        ("a", "dog"),
        ("b", "dog"),
        ("a", "*"),
        ("b", "*"),
        ("*", "cat"),
        ("*", "dog"),
        ("*", "*"),
    }
    assert s[("a", "dog")]["mAP"] == 0.75 and s[("a", "dog")]["top1"] == 0.5 and s[("a", "dog")]["top5"] == 1.0
    a = s[("a", "*")]
    assert (a["n_queries"], a["n_scored"], a["n_undefined"], a["n_failed"]) == (4, 3, 1, 0)
    assert a["mAP"] == pytest.approx(1.75 / 3) and a["top5"] == pytest.approx(2 / 3)
    b = s[("b", "*")]
    assert (b["n_failed"], b["n_scored"]) == (1, 0) and math.isnan(b["mAP"]) and math.isnan(b["top1"])
    assert s[("*", "*")]["n_queries"] == 5
    assert list(s)[-1] == ("*", "*")  # the overall row comes last
    rng = np.random.default_rng(5)
    many = [{"method": "m", "class": "c", "status": "ok", "ap": float(a), "first_rank": 1} for a in rng.random(500)]
    assert summarize(many) == summarize(many[::-1])  # exact: mAP does not depend on query order


# ====================================================================== similarities


def test_cosine_scores_match_heads_and_do_not_depend_on_other_rows():
    rng = np.random.default_rng(2)
    q, g = rng.normal(size=16).astype(np.float32), rng.normal(size=(9, 16)).astype(np.float32)
    s = cosine_scores(q, g)
    for i in range(9):
        assert abs(s[i] - heads.cosine(q, g[i])) <= FLOAT32_SAME_ARITHMETIC_ATOL
    perm = rng.permutation(9)
    assert np.array_equal(cosine_scores(q, g[perm]), s[perm])  # bit-exact
    assert np.array_equal(cosine_scores(q, g[:3]), s[:3])


@pytest.mark.parametrize("block", [rank_encoders.MAXCOS_BLOCK, 40])
def test_maxcos_scores_equal_masked_maxcos(monkeypatch, block):
    monkeypatch.setattr(rank_encoders, "MAXCOS_BLOCK", block)  # 40 floats: one gallery image per block
    rng = np.random.default_rng(3)
    q = rng.normal(size=(12, 8)).astype(np.float32)
    gallery = [rng.normal(size=(int(m), 8)).astype(np.float32) for m in rng.integers(1, 20, 7)]
    weights = (rng.random(12) > 0.5).astype(np.float32)
    weights[0] = 1.0
    got = maxcos_scores(q, gallery, cp_keep(weights))
    got_all = maxcos_scores(q, gallery)
    for i, g in enumerate(gallery):
        assert abs(got[i] - heads.masked_maxcos(q, g, weights)[0]) <= MAXCOS_BLOCK_ATOL
        assert abs(got_all[i] - heads.masked_maxcos(q, g, np.ones(12, np.float32))[0]) <= MAXCOS_BLOCK_ATOL
    with pytest.raises(ValueError):
        maxcos_scores(q, gallery, np.zeros(12, bool))


# ====================================================================== ONNX encoder manifest


def _tiny_encoder(folder: Path, fixed_batch: int | None = None, size=(8, 8), name="enc.onnx") -> Path:
    """GlobalAveragePool over [B, 3, H, W] then a fixed linear map (identity): the embedding of a
    solid-colour image is its normalised RGB."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    batch = fixed_batch if fixed_batch else "B"
    x = helper.make_tensor_value_info("images", TensorProto.FLOAT, [batch, 3, size[0], size[1]])
    y = helper.make_tensor_value_info("embedding", TensorProto.FLOAT, [batch, 3])
    w = numpy_helper.from_array(np.eye(3, dtype=np.float32), "W")
    nodes = [
        helper.make_node("GlobalAveragePool", ["images"], ["gap"]),
        helper.make_node("Flatten", ["gap"], ["flat"], axis=1),
        helper.make_node("MatMul", ["flat", "W"], ["embedding"]),
    ]
    graph = helper.make_graph(nodes, "tiny_encoder", [x], [y], initializer=[w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path = folder / name
    onnx.save(model, str(path))
    return path


def _manifest(folder: Path, onnx_name="enc.onnx", **over) -> Path:
    d = {
        "format": "masc-rank-encoder/1",
        "name": "tiny",
        "onnx": onnx_name,
        "input": "images",
        "input_size": [8, 8],
        "mean": [0, 0, 0],
        "std": [1, 1, 1],
        "resize": "stretch",
        "output": "embedding",
        "output_kind": "embedding",
        **over,
    }
    path = folder / "encoder.json"
    path.write_text(json.dumps(d))
    return path


def _solid(path: Path, rgb, size=(10, 6)):
    Image.fromarray(np.full((size[1], size[0], 3), rgb, np.uint8)).save(path)


def _write_csv(path: Path, header, rows):
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=header)
        w.writeheader()
        w.writerows(rows)


@pytest.fixture()
def colour_data(tmp_path):
    """Gallery: A = red, blue; B = yellow, green. Queries (hand-ranked in the test below)."""
    d = tmp_path / "colours"
    d.mkdir()
    for name, rgb, size in [
        ("red", (255, 0, 0), (10, 6)),
        ("blue", (0, 0, 255), (8, 8)),
        ("yellow", (255, 255, 0), (5, 9)),
        ("green", (0, 255, 0), (16, 16)),
        ("orange", (255, 128, 0), (7, 7)),
        ("q_green", (0, 255, 0), (3, 12)),
    ]:
        _solid(d / f"{name}.png", rgb, size)
    _write_csv(
        d / "gallery.csv",
        ["image", "identity", "class"],
        [
            {"image": "red.png", "identity": "A", "class": "warm"},
            {"image": "blue.png", "identity": "A", "class": "warm"},
            {"image": "yellow.png", "identity": "B", "class": "cool"},
            {"image": "green.png", "identity": "B", "class": "cool"},
        ],
    )
    _write_csv(
        d / "queries.csv",
        ["key", "image", "identity", "method"],
        [
            {"key": "q1", "image": "orange.png", "identity": "A", "method": "m1"},
            {"key": "q2", "image": "q_green.png", "identity": "B", "method": "m2"},
            {"key": "q3", "image": "orange.png", "identity": "C", "method": "m1"},
            {"key": "q4", "image": "nowhere.png", "identity": "A", "method": "m2"},
            {"key": "q5", "image": "", "identity": "A", "method": "m2"},
        ],
    )
    _tiny_encoder(d)
    return d


def test_onnx_encoder_ranks_as_computed_by_hand(colour_data, tmp_path):
    """Embeddings = RGB / 255. Query q1 (orange, A): cosines yellow 0.949 (B), red 0.894 (A),
    green 0.447 (B), blue 0 (A): relevant at ranks 2 and 4, AP = (1/2 + 2/4) / 2 = 0.5.
    q2 (green, B): green 1 (B), yellow 0.707 (B): AP 1. q3: identity C absent: undefined."""
    out = tmp_path / "r.csv"
    res = CliRunner().invoke(
        rank_main,
        [
            str(colour_data / "queries.csv"),
            "--gallery",
            str(colour_data / "gallery.csv"),
            "--encoder-manifest",
            str(_manifest(colour_data)),
            "--out",
            str(out),
            "--no-progress",
        ],
    )
    assert res.exit_code == 0, res.output
    rows = {r["key"]: r for r in csv.DictReader(open(out, encoding="utf-8"))}
    assert list(rows) == ["q1", "q2", "q3", "q4", "q5"]  # input order, extra columns carried
    q1 = rows["q1"]
    assert q1["status"] == "ok" and float(q1["ap"]) == pytest.approx(0.5)
    assert (q1["first_rank"], q1["top1"], q1["top5"], q1["n_relevant"], q1["n_gallery"]) == ("2", "0", "1", "2", "4")
    assert q1["top1_image"] == "yellow.png" and q1["top1_identity"] == "B" and q1["class"] == "warm"
    exact = cosine_scores(np.array([1, 128 / 255, 0], np.float32), np.array([[1, 1, 0]], np.float32))[0]
    assert float(q1["top1_score"]) == pytest.approx(exact, abs=FLOAT32_SAME_ARITHMETIC_ATOL)
    q2 = rows["q2"]
    assert q2["status"] == "ok" and float(q2["ap"]) == 1.0 and q2["first_rank"] == "1"
    assert q2["top1_image"] == "green.png" and float(q2["top1_score"]) == pytest.approx(1.0, abs=SELF_CP_ATOL)
    assert rows["q3"]["status"] == "no_relevant_gallery_item" and rows["q3"]["ap"] == "nan"
    assert rows["q4"]["status"] == "missing_file" and "nowhere.png" in rows["q4"]["status_detail"]
    assert rows["q5"]["status"] == "bad_row"
    summ = {(r["method"], r["class"]): r for r in csv.DictReader(open(tmp_path / "r.summary.csv", encoding="utf-8"))}
    overall = summ[("*", "*")]
    counts = (overall["n_queries"], overall["n_scored"], overall["n_undefined"], overall["n_failed"])
    assert counts == ("5", "2", "1", "2")
    assert float(overall["mAP"]) == pytest.approx(0.75)
    assert float(overall["top1"]) == 0.5 and float(overall["top5"]) == 1.0
    assert float(summ[("m1", "*")]["mAP"]) == 0.5 and summ[("m1", "*")]["n_undefined"] == "1"
    assert float(summ[("m2", "*")]["mAP"]) == 1.0 and summ[("m2", "*")]["n_failed"] == "2"
    assert float(summ[("*", "cool")]["mAP"]) == 1.0 and float(summ[("*", "warm")]["mAP"]) == 0.5
    assert "mAP" in res.output and "missing_file: 1" in res.output


def test_onnx_encoder_oracle_leave_one_out_and_class_level(colour_data):
    """Oracle on the colour gallery: red's only other A image is blue (cosine 0), ranked after
    yellow (0.707); at class level (warm = red, blue) the same; green -> yellow (B) first."""
    enc = rank_encoders.OnnxEmbeddingEncoder(_manifest(colour_data))
    rep = rank.run_rank(colour_data / "gallery.csv", enc, oracle=True)
    by = {r["image"]: r for r in rep.rows}
    assert all(r["n_excluded"] == 1 and r["n_gallery"] == 3 and r["method"] == "oracle" for r in rep.rows)
    assert by["red.png"]["first_rank"] == 3 and by["red.png"]["ap"] == pytest.approx(1 / 3)  # blue: 0, green: 0 tie
    assert by["green.png"]["first_rank"] == 1 and by["green.png"]["top1_image"] == "yellow.png"
    assert all(r["top1_image"] != r["image"] for r in rep.rows)
    cls = rank.run_rank(colour_data / "gallery.csv", enc, oracle=True, level="class")
    assert [r["ap"] for r in cls.rows] == [r["ap"] for r in rep.rows]  # classes coincide with identities here


def test_onnx_encoder_fixed_batch_and_nhwc(colour_data):
    ims = [Image.open(colour_data / f"{n}.png") for n in ("red", "blue", "yellow")]
    dyn = rank_encoders.OnnxEmbeddingEncoder(_manifest(colour_data)).embed(ims)
    np.testing.assert_allclose(dyn, [[1, 0, 0], [0, 0, 1], [1, 1, 0]], atol=FLOAT32_SAME_ARITHMETIC_ATOL)
    _tiny_encoder(colour_data, fixed_batch=1, name="b1.onnx")
    enc1 = rank_encoders.OnnxEmbeddingEncoder(_manifest(colour_data, "b1.onnx"), batch_size=8)
    assert enc1.batch_size == 1
    np.testing.assert_allclose(enc1.embed(ims), dyn, atol=BATCH_INVARIANCE_ATOL)


def test_manifest_preprocess_resize_modes():
    """A 4x2 (WxH) image, left half red, right half blue, nearest resampling."""
    arr = np.zeros((2, 4, 3), np.uint8)
    arr[:, :2, 0] = 255
    arr[:, 2:, 2] = 255
    im = Image.fromarray(arr)
    base = dict(
        onnx=Path("x.onnx"), input="x", mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), output="y", interpolation="nearest"
    )
    crop = rank_encoders.manifest_preprocess(
        im, rank_encoders.EncoderManifest(input_size=(2, 2), resize="center_crop", **base)
    )
    assert crop.shape == (3, 2, 2)
    np.testing.assert_array_equal(crop[0], [[1, -1], [1, -1]])  # (1 - .5) / .5 = 1 red, -1 elsewhere
    np.testing.assert_array_equal(crop[2], [[-1, 1], [-1, 1]])
    box = rank_encoders.manifest_preprocess(
        im, rank_encoders.EncoderManifest(input_size=(4, 4), resize="letterbox", layout="NHWC", **base)
    )
    assert box.shape == (4, 4, 3)
    np.testing.assert_array_equal(box[0], 0)  # padding = the mean colour = 0 after normalisation
    np.testing.assert_array_equal(box[3], 0)
    np.testing.assert_array_equal(box[1:3, :2, 0], 1)
    np.testing.assert_array_equal(box[1:3, 2:, 2], 1)
    st = rank_encoders.manifest_preprocess(
        im,
        rank_encoders.EncoderManifest(
            input_size=(3, 2), resize="stretch", pixel_scale=1.0, **{**base, "mean": (0, 0, 0), "std": (1, 1, 1)}
        ),
    )
    assert st.shape == (3, 3, 2) and st.max() == 255.0  # pixel_scale 1: raw 0..255


@pytest.mark.parametrize("size", [[100000, 100000], [1e30, 1], [2.5, 8], [True, 8], [0, 8], "88"])
def test_encoder_input_sizes_out_of_range_are_one_line(colour_data, size):
    """An ``input_size`` side must be an integer in 1..8192 (a bundle's image-side bound):
    [100000, 100000] used to end in a MemoryError and [1e30, 1] in an OverflowError in masc-rank."""
    with pytest.raises(EncoderManifestError) as e:
        rank_encoders.load_encoder_manifest(_manifest(colour_data, input_size=size))
    assert str(e.value).endswith(f"input_size must be [H, W], integers 1..8192, got {str(size)[:60]}")
    assert "\n" not in str(e.value)


def test_bad_manifests_are_refused(colour_data, tmp_path):
    with pytest.raises(EncoderManifestError, match="does not exist"):
        rank_encoders.load_encoder_manifest(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    for content, msg in [
        ("{not json", "not valid JSON"),
        (json.dumps({"onnx": "enc.onnx"}), "missing key"),
        (json.dumps({**json.loads(_manifest(colour_data).read_text()), "resize": "squash"}), "resize"),
        (json.dumps({**json.loads(_manifest(colour_data).read_text()), "output_kind": "tokens"}), "output_kind"),
        (json.dumps({**json.loads(_manifest(colour_data).read_text()), "input_size": [8]}), "input_size"),
    ]:
        bad.write_text(content)
        with pytest.raises(EncoderManifestError, match=msg):
            rank_encoders.load_encoder_manifest(bad)
    with pytest.raises(EncoderManifestError, match="does not exist"):
        rank_encoders.load_encoder_manifest(_manifest(colour_data, "missing.onnx"))
    for over, msg in [
        ({"input": "pixels"}, "input named"),
        ({"output": "feat"}, "no output"),
        ({"input_size": [16, 16]}, "input_size"),
        ({"sha256": "0" * 64}, "sha256"),
    ]:
        with pytest.raises(EncoderManifestError, match=msg):
            rank_encoders.OnnxEmbeddingEncoder(_manifest(colour_data, **over))
    import hashlib

    good = hashlib.sha256((colour_data / "enc.onnx").read_bytes()).hexdigest()
    rank_encoders.OnnxEmbeddingEncoder(_manifest(colour_data, sha256=good))


def test_cli_usage_errors(colour_data):
    g = str(colour_data / "gallery.csv")
    q = str(colour_data / "queries.csv")
    m = str(_manifest(colour_data))
    cases = [
        ([q, "--gallery", g], "exactly one of"),
        ([q, "--gallery", g, "--encoder-manifest", m, "--oracle"], "no QUERIES_CSV"),
        (["--gallery", g, "--encoder-manifest", m], "QUERIES_CSV, or --oracle"),
        ([q, "--gallery", g, "--encoder-manifest", m, "--similarity", "maxcos"], "patch tokens"),
        ([q, "--gallery", str(colour_data / "nope.csv"), "--encoder-manifest", m], "does not exist"),
    ]
    for args, msg in cases:
        res = CliRunner().invoke(rank_main, args + ["--no-progress"])
        assert res.exit_code != 0 and msg in res.output, (args, res.output)
    _write_csv(colour_data / "g2.csv", ["image", "who"], [{"image": "red.png", "who": "A"}])
    res = CliRunner().invoke(rank_main, [q, "--gallery", str(colour_data / "g2.csv"), "--encoder-manifest", m])
    assert res.exit_code != 0 and "identity" in res.output


# ====================================================================== engine: small examples gallery


@pytest.fixture(scope="module")
def examples_gallery(tmp_path_factory):
    """The 22 example DreamBooth photos as a gallery (classes: backpack bag, cat and dog2 pet,
    teapot kitchen), plus a broken gallery row that must be left out, not crash the run."""
    d = tmp_path_factory.mktemp("examples")
    shutil.copytree(EXAMPLES / "images", d / "images")
    shutil.copytree(EXAMPLES / "masks", d / "masks")
    cls = {"backpack": "bag", "cat": "pet", "dog2": "pet", "teapot": "kitchen"}
    rows = [
        {"image": f"images/{s}/{f.name}", "mask": f"masks/{s}/{f.stem}.png", "identity": s, "class": cls[s]}
        for s in sorted(cls)
        for f in sorted((EXAMPLES / "images" / s).glob("*.jpg"))
    ]
    rows.append({"image": "images/cat/99.jpg", "mask": "", "identity": "cat", "class": "pet"})
    _write_csv(d / "gallery.csv", ["image", "mask", "identity", "class"], rows)
    return d


def test_engine_maxcos_oracle_equals_masked_maxcos(naflex_bundle, examples_gallery):
    from masc_engine.runtime.io import load_image, load_mask
    from masc_engine.runtime.masks import mask_to_patch_grid
    from masc_engine.runtime.scorer import Scorer

    scorer = Scorer(naflex_bundle)
    enc = rank_encoders.EngineEncoder(scorer)
    rep = rank.run_rank(examples_gallery / "gallery.csv", enc, oracle=True, similarity="maxcos")
    assert len(rep.rows) == 23 and rep.gallery_size == 22
    assert [f["status"] for f in rep.gallery_failures] == ["missing_file"]
    by = {r["image"]: r for r in rep.rows}
    assert by["images/cat/99.jpg"]["status"] == "missing_file"
    ok = [r for r in rep.rows if r["status"] == "ok"]
    assert len(ok) == 22
    for r in ok:
        assert r["n_excluded"] == 1 and r["n_gallery"] == 21 and r["top1_image"] != r["image"]
        assert 0 < r["ap"] <= 1 and r["n_query_patches"] >= 1
    # Recompute one query by hand with the scorer's public pieces and heads.masked_maxcos.
    q = "images/dog2/00.jpg"
    paths = [r["image"] for r in ok]
    encs = dict(zip(paths, scorer.encode_images([load_image(str(examples_gallery / p)) for p in paths]), strict=True))
    qmask = load_mask(str(examples_gallery / "masks/dog2/00.png"))
    w = mask_to_patch_grid(qmask, encs[q].grid)
    assert by[q]["n_query_patches"] == int((w > scorer.fg_threshold).sum()) < encs[q].tokens.shape[0]
    scores = {
        p: heads.masked_maxcos(encs[q].tokens, encs[p].tokens, w, scorer.fg_threshold)[0] for p in paths if p != q
    }
    best = max(scores, key=scores.get)
    assert abs(by[q]["top1_score"] - scores[best]) <= MAXCOS_BLOCK_ATOL + BATCH_INVARIANCE_ATOL
    relevant = [p.startswith("images/dog2/") for p in scores]
    assert by[q]["ap"] == pytest.approx(
        average_precision(list(scores.values()), relevant), abs=FLOAT64_SAME_FORMULA_TOL
    )
    # Without masks every query patch counts.
    nomask = rank.run_rank(examples_gallery / "gallery.csv", enc, oracle=True, similarity="maxcos", use_masks=False)
    nm = {r["image"]: r for r in nomask.rows}
    assert nm[q]["n_query_patches"] == encs[q].tokens.shape[0]
    # Class level: the relevant set grows, so the first correct rank can only improve.
    cls = rank.run_rank(examples_gallery / "gallery.csv", enc, oracle=True, similarity="maxcos", level="class")
    for r in cls.rows:
        if r["status"] == "ok":
            assert r["first_rank"] <= by[r["image"]]["first_rank"]
            assert r["n_relevant"] >= by[r["image"]]["n_relevant"]


def test_engine_queries_file_bad_rows_get_statuses(naflex_bundle, examples_gallery, tmp_path):
    d = examples_gallery
    (tmp_path / "broken.jpg").write_bytes(b"not a jpeg")
    Image.fromarray(np.zeros((20, 10), np.uint8)).save(tmp_path / "small.png")
    im = Image.open(EXAMPLES / "images/cat/00.jpg")
    Image.fromarray(np.zeros((im.height, im.width), np.uint8)).save(tmp_path / "empty.png")
    a = lambda p: str(d / p)  # noqa: E731
    rows = [
        {"image": a("images/cat/01.jpg"), "identity": "cat", "method": "copy", "mask": a("masks/cat/01.png")},
        {"image": a("images/dog2/03.jpg"), "identity": "dog2", "method": "copy", "mask": ""},
        {"image": str(tmp_path / "broken.jpg"), "identity": "cat", "method": "gen", "mask": ""},
        {"image": a("images/cat/00.jpg"), "identity": "cat", "method": "gen", "mask": str(tmp_path / "small.png")},
        {"image": a("images/cat/00.jpg"), "identity": "cat", "method": "gen", "mask": str(tmp_path / "empty.png")},
        {"image": a("images/cat/00.jpg"), "identity": "cat", "method": "gen", "mask": str(tmp_path / "gone.png")},
        {"image": a("images/cat/00.jpg"), "identity": "", "method": "gen", "mask": ""},
        {"image": a("images/cat/00.jpg"), "identity": "unicorn", "method": "gen", "mask": ""},
    ]
    _write_csv(tmp_path / "q.csv", ["image", "identity", "method", "mask"], rows)
    out = tmp_path / "out.csv"
    res = CliRunner().invoke(
        rank_main,
        [
            str(tmp_path / "q.csv"),
            "--gallery",
            str(d / "gallery.csv"),
            "--bundle",
            str(naflex_bundle),
            "--similarity",
            "maxcos",
            "--out",
            str(out),
            "--no-progress",
        ],
    )
    assert res.exit_code == 0, res.output
    got = list(csv.DictReader(open(out, encoding="utf-8")))
    assert [r["status"] for r in got] == [
        "ok",
        "ok",
        "unreadable_image",
        "mask_size_mismatch",
        "empty_query_mask",
        "missing_file",
        "bad_row",
        "no_relevant_gallery_item",
    ]
    # A query that is a gallery file is excluded from its own gallery (never retrieves itself).
    assert got[0]["n_excluded"] == "1" and got[0]["n_gallery"] == "21" and got[0]["class"] == "pet"
    assert got[0]["top1_image"] != "images/cat/01.jpg"
    assert "gallery rows left out: 1" in res.output


# ====================================================================== engine: real galleries, oracle


def _read(path):
    with open(path, encoding="utf-8") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module", params=photo_sets())
def shared_oracle(naflex_bundle, tmp_path_factory, request):
    """masc-rank --oracle on a real gallery (the shipped examples; the shared set too when present
    beside the checkout), and again on the rows shuffled (absolute paths)."""
    root = request.param
    d = tmp_path_factory.mktemp("rank-oracle")
    rows = _read(root / "gallery.csv")
    rng = np.random.default_rng(7)
    shuffled = [
        {**rows[i], "image": str(root / rows[i]["image"]), "mask": str(root / rows[i]["mask"])}
        for i in rng.permutation(len(rows))
    ]
    _write_csv(d / "shuffled.csv", list(rows[0]), shuffled)
    runs = {}
    for name, gallery in (("original", root / "gallery.csv"), ("shuffled", d / "shuffled.csv")):
        out = d / f"{name}.csv"
        res = CliRunner().invoke(
            rank_main,
            ["--oracle", "--gallery", str(gallery), "--bundle", str(naflex_bundle), "--out", str(out), "--no-progress"],
        )
        assert res.exit_code == 0, res.output
        runs[name] = (_read(out), _read(d / f"{name}.summary.csv"), res.output)
    return root, rows, runs


def test_shared_oracle_structure_and_invariants(shared_oracle):
    _, gallery, runs = shared_oracle
    rows, summary, output = runs["original"]
    n = len(gallery)
    assert len(rows) == n and n in (22, 158)  # examples/dreambooth, shared set
    counts = {}
    for g in gallery:
        counts[g["identity"]] = counts.get(g["identity"], 0) + 1
    for r, g in zip(rows, gallery, strict=True):
        assert r["status"] == "ok", r
        assert r["query"] == g["image"] and r["identity"] == g["identity"] and r["class"] == g["class"]
        assert r["method"] == "oracle" and r["similarity"] == "global" and r["level"] == "identity"
        # leave-one-out: the query is never in its own gallery, so it cannot retrieve itself
        assert r["n_excluded"] == "1" and r["n_gallery"] == str(n - 1) and r["top1_image"] != r["query"]
        n_rel = int(r["n_relevant"])
        assert n_rel == counts[g["identity"]] - 1 >= 1
        ap, first = float(r["ap"]), int(r["first_rank"])
        assert 0 < ap <= 1 and 1 <= first <= n - 1 - n_rel + 1
        assert (
            ap <= (1 / first + n_rel - 1) / n_rel + FLOAT64_SAME_FORMULA_TOL
        )  # the first hit's precision is 1/first, the rest <= 1
        assert r["top1"] == str(int(first == 1)) and r["top5"] == str(int(first <= 5))
        assert (r["top1_identity"] == r["identity"]) == (first == 1)
        assert -1 <= float(r["top1_score"]) <= 1 + SELF_CP_ATOL
    s = {(x["method"], x["class"]): x for x in summary}
    overall = s[("*", "*")]
    assert overall["n_queries"] == str(n) and overall["n_scored"] == str(n)
    assert overall["n_undefined"] == "0" and overall["n_failed"] == "0"
    assert 0 <= float(overall["mAP"]) <= 1
    assert float(overall["mAP"]) == pytest.approx(np.mean([float(r["ap"]) for r in rows]), abs=FLOAT64_SAME_FORMULA_TOL)
    assert float(overall["top1"]) == pytest.approx(np.mean([int(r["top1"]) for r in rows]))
    assert float(overall["top1"]) <= float(overall["top5"])
    assert s[("oracle", "*")]["mAP"] == overall["mAP"]
    classes = {g["class"] for g in gallery}
    assert {c for (m, c) in s if m == "oracle" and c != "*"} == classes
    assert sum(int(s[("oracle", c)]["n_queries"]) for c in classes) == n
    assert "WARNING" in output and "random weights" in output


def test_shared_oracle_is_independent_of_gallery_row_order(shared_oracle):
    """Run twice (original and shuffled rows): every query's result is bit-identical."""
    root, gallery, runs = shared_oracle
    key = lambda r: os.path.realpath(root / r["query"])  # noqa: E731
    a = {key(r): r for r in runs["original"][0]}
    b = {key(r): r for r in runs["shuffled"][0]}
    assert a.keys() == b.keys() and len(a) == len(gallery)
    for k in a:
        for col in ("ap", "first_rank", "n_relevant", "n_gallery", "top1_score", "top1_identity"):
            assert a[k][col] == b[k][col], (k, col)
        assert os.path.realpath(root / a[k]["top1_image"]) == os.path.realpath(b[k]["top1_image"])
    sa = {(x["method"], x["class"]): x for x in runs["original"][1]}
    sb = {(x["method"], x["class"]): x for x in runs["shuffled"][1]}
    assert sa == sb


def test_global_embedding_is_the_unmasked_pooling_head(naflex_bundle, shared_oracle):
    """top1_score equals the cosine of pool_background(all patches visible) embeddings."""
    from masc_engine.runtime.io import load_image
    from masc_engine.runtime.scorer import Scorer

    root, _, runs = shared_oracle
    rows = runs["original"][0][:3]
    s = Scorer(naflex_bundle)
    for r in rows:
        encs = s.encode_images([load_image(str(root / r["query"])), load_image(str(root / r["top1_image"]))])
        pooled, _ = s.pool_background(encs, [np.zeros(e.tokens.shape[0], bool) for e in encs])
        assert abs(heads.cosine(pooled[0], pooled[1]) - float(r["top1_score"])) <= 10 * BATCH_INVARIANCE_ATOL
