"""masc-run keeps every score that is defined: per-score statuses, empty prompts as
data, one mask rule, and the API's argument checks.

The rows of the issue's table plus a normal row, scored by masc-run on the tiny random-weight
NaFlex bundle and by masc-metric 0.3.0 on the same checkpoint: every score masc-metric defines
equals ours within ``ORACLE_SCORE_ATOL``, NaN only where masc-metric has NaN.
"""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest
from PIL import Image

from support import EXAMPLES, oracle_for
from masc_engine import MaSC
from masc_engine.errors import InputError
from masc_engine.jobs.pairs import RunOptions, RunSettings, run_pairs
from masc_engine.jobs.results import read_output
from masc_engine.runtime.io import image_from_bytes, mask_from_bytes
from masc_engine.runtime.masks import mask_coverage
from masc_engine.tolerances import JPEG_MASK_COVERAGE_ATOL, ORACLE_SCORE_ATOL

REF, OUT = "images/cat/00.jpg", "images/cat/01.jpg"


def _save(path, arr: np.ndarray) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(arr).save(path)
    return str(path)


def _rect(shape, frac_h: float, frac_w: float, value: int) -> np.ndarray:
    m = np.zeros(shape, np.uint8)
    m[: round(shape[0] * frac_h), : round(shape[1] * frac_w)] = value
    return m


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    """The issue's rows as a pairs CSV (and the arrays the oracle gets)."""
    d = tmp_path_factory.mktemp("rows")
    ref_im, out_im = Image.open(EXAMPLES / REF), Image.open(EXAMPLES / OUT)
    rshape, oshape = (ref_im.height, ref_im.width), (out_im.height, out_im.width)
    ref_m = np.array(Image.open(EXAMPLES / "masks/cat/00.png").convert("L"))
    out_m = np.array(Image.open(EXAMPLES / "masks/cat/01.png").convert("L"))
    blob = np.zeros(rshape, np.uint8)
    blob[100:103, 200:203] = 255  # foreground pixels, but no patch above 0.5
    masks = {
        "ref": ref_m,
        "out": out_m,
        "black": np.zeros(rshape, np.uint8),
        "blob": blob,
        "ref01": _rect(rshape, 0.46, 0.5, 1),
        "out01": _rect(oshape, 0.66, 0.5, 1),  # 23% / 33%, values 0/1
        "white": np.full(oshape, 255, np.uint8),
    }
    paths = {k: _save(d / "masks" / f"{k}.png", v) for k, v in masks.items()}
    ref, out = str(EXAMPLES / REF), str(EXAMPLES / OUT)
    rows = [  # key, ref mask, out mask, prompt, object_name
        ("normal", "ref", "out", "a cat on the beach", "cat"),
        ("black_reference_mask", "black", "out", "a cat on the beach", "cat"),
        ("blob_reference_mask", "blob", "out", "a cat on the beach", "cat"),
        ("empty_prompt", "ref", "out", "", "cat"),
        ("masks_0_1", "ref01", "out01", "a cat on the beach", "cat"),
        ("prompt_is_subject", "ref", "out", "a cat", "cat"),
        ("white_output_mask", "ref", "white", "a cat on the beach", "cat"),
    ]
    csv_path = d / "pairs.csv"
    with open(csv_path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["key", "ref_image", "ref_mask", "out_image", "out_mask", "prompt", "object_name"])
        for key, rm, om, prompt, name in rows:
            w.writerow([key, ref, paths[rm], out, paths[om], prompt, name])
    return {"csv": csv_path, "rows": rows, "masks": masks, "dir": d}


def _run(bundle, table, out, **settings):
    from masc_engine.runtime.scorer import Scorer

    run_pairs(table["csv"], Scorer(bundle), out, RunSettings(**settings), options=RunOptions(progress=False))
    return {r["key"]: r for r in read_output(out)}


@pytest.mark.oracle
def test_issue_table_rows_equal_masc_metric(naflex_bundle, table, tmp_path):
    got = _run(naflex_bundle, table, tmp_path / "scores.jsonl")
    oracle = oracle_for(naflex_bundle)
    ref_im, out_im = Image.open(EXAMPLES / REF), Image.open(EXAMPLES / OUT)
    for key, rm, om, prompt, name in table["rows"]:
        ref = oracle.score(ref_im, table["masks"][rm], out_im, table["masks"][om], prompt, name)
        r = got[key]
        for score in ("cp", "pf"):
            ours = math.nan if r[score] is None else float(r[score])
            assert math.isnan(ours) == math.isnan(ref_val := getattr(ref, score)), (key, score, ours, ref_val)
            if not math.isnan(ref_val):
                assert abs(ours - ref_val) <= ORACLE_SCORE_ATOL, (key, score)
            # a score is NaN exactly when its status says why
            assert (r[f"{score}_status"] == "ok") == (not math.isnan(ours)), (key, score, r[f"{score}_status"])
        assert r["status"] == next((s for s in (r["cp_status"], r["pf_status"]) if s != "ok"), "ok")
    assert got["normal"]["status"] == "ok" and got["normal"]["prompt_empty"] is False
    assert got["black_reference_mask"]["cp_status"] == "empty_reference_mask"
    assert got["blob_reference_mask"]["cp_status"] == "reference_mask_below_threshold"
    assert got["white_output_mask"]["pf_status"] == "no_background" and got["white_output_mask"]["cp_status"] == "ok"
    for key in ("empty_prompt", "prompt_is_subject"):  # data, flagged, CP never lost to the prompt
        r = got[key]
        assert r["status"] == "ok" and r["prompt_empty"] is True and "prompt_empty" in r["status_detail"]
        assert r["prompt_text"] == "" and r["cp"] == got["normal"]["cp"]


def test_mask_coverage_uses_the_scoring_rule(naflex_bundle, table, tmp_path):
    """A 0/1 mask covering 23% reports 23%, and the row survives --paper-filter (5%)."""
    m = table["masks"]
    assert (
        mask_coverage(m["ref01"]) == pytest.approx(np.mean(m["ref01"] == 1))
        and round(mask_coverage(m["ref01"]), 2) == 0.23
    )
    got = _run(naflex_bundle, table, tmp_path / "filtered.csv", min_reference_mask_frac=0.05, min_output_mask_frac=0.05)
    r = got["masks_0_1"]
    assert r["status"] == "ok" and round(float(r["ref_mask_coverage"]), 2) == 0.23
    assert round(float(r["out_mask_coverage"]), 2) == 0.33
    assert got["black_reference_mask"]["status"] == "filtered_reference_mask"
    assert got["normal"]["status"] == "ok"


@pytest.mark.parametrize("encoding", ["0/255", "0/1", "float", "bool", "palette", "16-bit", "jpeg"])
def test_one_mask_rule_for_every_encoding(encoding, tmp_path):
    """Coverage is the share of pixels the patch downsample reads as foreground (>= 0.5 after
    normalisation), whatever way the loader accepted the mask."""
    import io

    base = np.zeros((64, 80), np.uint8)
    base[8:40, 10:50] = 1  # 32 x 40 = 25% of the image
    if encoding in ("0/255", "0/1", "float", "bool"):
        arr = {"0/255": base * 255, "0/1": base, "float": base.astype(np.float32), "bool": base.astype(bool)}[encoding]
    else:
        buf = io.BytesIO()
        if encoding == "palette":
            im = Image.fromarray(base * 3, "P")  # index 3 = the label
            im.putpalette([0, 0, 0] * 3 + [200, 10, 10] + [0, 0, 0] * 252)
            im.save(buf, "PNG")
        elif encoding == "16-bit":
            Image.fromarray(base.astype(np.uint16) * 65535).save(buf, "PNG")
        else:
            Image.fromarray(base * 255).save(buf, "JPEG", quality=75)
        arr = mask_from_bytes(buf.getvalue(), f"mask.{encoding}")
    assert mask_coverage(arr) == pytest.approx(0.25, abs=JPEG_MASK_COVERAGE_ATOL), encoding


# ------------------------------------------------------------------ API boundary checks


@pytest.fixture(scope="module")
def masc(naflex_bundle):
    return MaSC(naflex_bundle)


def _args():
    ref_im, out_im = Image.open(EXAMPLES / REF), Image.open(EXAMPLES / OUT)
    m = np.array(Image.open(EXAMPLES / "masks/cat/00.png").convert("L"))
    o = np.array(Image.open(EXAMPLES / "masks/cat/01.png").convert("L"))
    return dict(ref_image=ref_im, ref_mask=m, out_image=out_im, out_mask=o, prompt="a cat", object_name="cat")


@pytest.mark.parametrize(
    "name, value, err, text",
    [
        ("prompt", None, TypeError, "prompt must be a str, got NoneType"),
        ("object_name", 5, TypeError, "object_name must be a str or None, got int"),
        ("ref_mask", [[0, 1]], TypeError, "ref_mask must be a numpy array"),
        ("out_mask", np.array(["a"]), TypeError, "out_mask must be a numpy array"),
        ("ref_image", np.zeros((4, 4, 3), np.uint8), TypeError, "ref_image must be a PIL.Image.Image"),
        ("out_mask", np.zeros((4, 4, 3), np.uint8), ValueError, "out_mask must be 2-D"),
        ("ref_mask", np.zeros((5, 5), np.uint8), ValueError, "reference mask is 5x5"),
    ],
)
def test_arguments_checked_before_any_inference(masc, monkeypatch, name, value, err, text):
    def no_inference(*a, **k):
        raise AssertionError("inference ran before the arguments were checked")

    monkeypatch.setattr(masc.vision, "run", no_inference)
    monkeypatch.setattr(masc.text, "run", no_inference)
    with pytest.raises(err, match=text):
        masc.score(**{**_args(), name: value})
    from masc_engine import Pair

    with pytest.raises(err, match=f"pairs\\[1\\]\\.{name}" if err is TypeError else text):
        masc.score_batch([Pair(**_args()), Pair(**{**_args(), name: value})])
    with pytest.raises(TypeError, match=r"pairs\[0\] must be a masc_engine.Pair"):
        masc.score_batch([tuple(_args().values())])


def test_scorer_options_checked(naflex_bundle):
    from masc_engine.runtime.scorer import Scorer

    for kw, err, text in (
        ({"batch_size": "8"}, TypeError, "batch_size must be an int"),
        ({"batch_size": 0}, ValueError, "batch_size must be >= 1"),
        ({"fg_threshold": "0.5"}, TypeError, "fg_threshold must be a number"),
        ({"fg_threshold": 2.0}, ValueError, r"fg_threshold must be in \[0, 1\]"),
        ({"provider": 3}, TypeError, "provider must be a str or None"),
        ({"naflex_max_patches": 25.5}, TypeError, "naflex_max_patches must be an int"),
    ):
        with pytest.raises(err, match=text):
            Scorer(naflex_bundle, **kw)


def test_input_error_is_a_value_error_and_names_the_file():
    assert issubclass(InputError, ValueError)  # callers written for masc-metric's ValueError catch it
    with pytest.raises(ValueError) as e:
        image_from_bytes(b"certainly not an image", "photos/x.png")
    msg = str(e.value)
    assert "photos/x.png" in msg and "BytesIO" not in msg and " it" not in msg and "\n" not in msg
