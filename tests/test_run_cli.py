"""masc-run: bad rows get their reason, good rows are scored (equal to the Python API)."""

from __future__ import annotations

import csv
import math
import shutil

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from support import EXAMPLES, load_pair, read_rows
from masc_engine.cli.run_cmd import main as run_main
from masc_engine.runtime.scorer import Pair, Scorer
from masc_engine.tolerances import BATCH_INVARIANCE_ATOL

HEADER = ["key", "method", "ref_image", "ref_mask", "out_image", "out_mask", "prompt", "object_name"]


@pytest.fixture()
def messy_csv(tmp_path):
    """A pairs file mixing good rows with every per-row failure masc-run must report."""
    data = tmp_path / "data"
    shutil.copytree(EXAMPLES / "images", data / "images")
    shutil.copytree(EXAMPLES / "masks", data / "masks")
    (data / "broken.jpg").write_bytes(b"this is not a jpeg")
    Image.fromarray(np.zeros((50, 40), np.uint8)).save(data / "small_mask.png")
    Image.fromarray(np.zeros((512, 384), np.uint8)).save(data / "empty_mask.png")
    im = Image.open(EXAMPLES / "images/cat/00.jpg")
    Image.fromarray(np.zeros((im.height, im.width), np.uint8)).save(data / "cat_empty.png")
    Image.fromarray(np.full((im.height, im.width), 255, np.uint8)).save(data / "cat_full.png")
    good = dict(
        ref_image="images/cat/00.jpg",
        ref_mask="masks/cat/00.png",
        out_image="images/cat/01.jpg",
        out_mask="masks/cat/01.png",
        prompt="a cat, on the beach\n(at dusk)",
        object_name="cat",
    )
    rows = [
        {"key": "good1", "method": "m1", **good},
        {"key": "missing", "method": "m1", **good, "out_image": "images/cat/99.jpg"},
        {"key": "broken", "method": "m1", **good, "out_image": "broken.jpg"},
        {"key": "mismatch", "method": "m2", **good, "out_mask": "small_mask.png"},
        {"key": "empty_ref", "method": "m2", **good, "ref_mask": "cat_empty.png"},
        {"key": "no_bg", "method": "m2", **good, "out_image": "images/cat/00.jpg", "out_mask": "cat_full.png"},
        {"key": "blank", "method": "m2", **good, "prompt": ""},
        {
            "key": "good2",
            "method": "m2",
            **good,
            "out_image": "images/dog2/01.jpg",
            "out_mask": "masks/dog2/01.png",
            "prompt": "ein Hund im Schnee – naïve café",
        },
    ]
    path = data / "pairs.csv"
    with open(path, "w", newline="", encoding="utf-8-sig") as f:  # with a byte-order mark
        w = csv.DictWriter(f, fieldnames=HEADER)
        w.writeheader()
        w.writerows(rows)
    return path


def test_bad_rows_get_reasons_and_good_rows_are_scored(naflex_bundle, messy_csv, tmp_path):
    out = tmp_path / "out.csv"
    res = CliRunner().invoke(
        run_main,
        [str(messy_csv), "--bundle", str(naflex_bundle), "--out", str(out), "--no-progress", "--chunk-size", "3"],
    )
    assert res.exit_code == 0, res.output
    rows = {r["key"]: r for r in csv.DictReader(open(out, encoding="utf-8"))}
    assert list(rows) == ["good1", "missing", "broken", "mismatch", "empty_ref", "no_bg", "blank", "good2"]
    status = {k: r["status"] for k, r in rows.items()}
    assert status == {
        "good1": "ok",
        "missing": "missing_file",
        "broken": "unreadable_image",
        "mismatch": "mask_size_mismatch",
        "empty_ref": "empty_reference_mask",
        "no_bg": "no_background",
        "blank": "ok",
        "good2": "ok",
    }
    assert "99.jpg" in rows["missing"]["status_detail"]
    assert "small_mask.png" in rows["mismatch"]["status_detail"]
    for k, r in rows.items():  # a score is NaN exactly when its own status says why
        for score in ("cp", "pf"):
            assert (r[f"{score}_status"] == "ok") == math.isfinite(float(r[score])), (k, score)
            if r[f"{score}_status"] != "ok":
                assert r["status_detail"]
    # an empty reference mask costs CP only, an output mask hiding everything PF only
    assert rows["empty_ref"]["cp_status"] == "empty_reference_mask" and rows["empty_ref"]["pf_status"] == "ok"
    assert rows["no_bg"]["cp_status"] == "ok" and rows["no_bg"]["pf_status"] == "no_background"
    # an empty prompt is data: scored and flagged
    assert rows["blank"]["prompt_empty"] == "True" and rows["good1"]["prompt_empty"] == "False"
    assert rows["good1"]["prompt"] == "a cat, on the beach\n(at dusk)"  # quoted comma + newline carried
    # Good rows equal the Python API on the same inputs.
    api = Scorer(naflex_bundle).score_batch(
        [
            Pair(
                *load_pair(
                    messy_csv.parent,
                    {
                        "ref_image": "images/cat/00.jpg",
                        "ref_mask": "masks/cat/00.png",
                        "out_image": "images/cat/01.jpg",
                        "out_mask": "masks/cat/01.png",
                        "prompt": "a cat, on the beach\n(at dusk)",
                        "object_name": "cat",
                    },
                )
            )
        ]
    )[0]
    assert abs(float(rows["good1"]["cp"]) - api.cp) <= BATCH_INVARIANCE_ATOL
    assert abs(float(rows["good1"]["pf"]) - api.pf) <= BATCH_INVARIANCE_ATOL
    assert "missing_file: 1" in res.output and "m2" in res.output


def test_missing_columns_name_the_file(naflex_bundle, tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("ref_image,prompt\na.jpg,hello\n")
    res = CliRunner().invoke(run_main, [str(bad), "--bundle", str(naflex_bundle), "--out", str(tmp_path / "o.csv")])
    assert res.exit_code != 0
    assert "bad.csv" in res.output and "ref_mask" in res.output


def test_missing_provider_is_an_error_not_a_fallback(naflex_bundle, tmp_path):
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime build has CUDA; the missing-provider path cannot be shown here")
    res = CliRunner().invoke(
        run_main,
        [
            str(EXAMPLES / "pairs.csv"),
            "--bundle",
            str(naflex_bundle),
            "--out",
            str(tmp_path / "o.csv"),
            "--provider",
            "cuda",
        ],
    )
    assert res.exit_code != 0 and "CUDAExecutionProvider" in res.output
    assert not (tmp_path / "o.csv").exists()


def test_example_rows_match_api(naflex_bundle, tmp_path):
    out = tmp_path / "ex.csv"
    res = CliRunner().invoke(
        run_main,
        [
            str(EXAMPLES / "pairs.csv"),
            "--bundle",
            str(naflex_bundle),
            "--out",
            str(out),
            "--no-progress",
            "--batch-size",
            "3",
        ],
    )
    assert res.exit_code == 0, res.output
    got = list(csv.DictReader(open(out)))
    api = Scorer(naflex_bundle).score_batch([Pair(*load_pair(EXAMPLES, r)) for r in read_rows(EXAMPLES)])
    for g, a in zip(got, api, strict=True):
        assert abs(float(g["cp"]) - a.cp) <= BATCH_INVARIANCE_ATOL
        assert abs(float(g["pf"]) - a.pf) <= BATCH_INVARIANCE_ATOL


def test_device_resident_run_equals_graph_head_run(naflex_bundle, tmp_path):
    """--device-resident on CPU (IO binding on host memory) writes the same scores as the host
    path through the same cp graph, and the meta sidecar records how the run was made."""
    import json

    outs = {}
    for flag in ("--device-resident", "--no-device-resident"):
        out = tmp_path / f"{flag.strip('-')}.csv"
        extra = ["--cp-head", "graph"] if flag == "--no-device-resident" else []
        res = CliRunner().invoke(
            run_main,
            [
                str(EXAMPLES / "pairs.csv"),
                "--bundle",
                str(naflex_bundle),
                "--out",
                str(out),
                "--no-progress",
                flag,
                *extra,
            ],
        )
        assert res.exit_code == 0, res.output
        outs[flag] = list(csv.DictReader(open(out)))
        meta = json.loads((tmp_path / f"{out.name}.meta.json").read_text())
        assert meta["settings"]["device_resident"] is (flag == "--device-resident")
        assert meta["settings"]["cp_head"] == "graph"
    assert len(outs["--device-resident"]) == len(read_rows(EXAMPLES)) == 20
    for a, b in zip(outs["--device-resident"], outs["--no-device-resident"], strict=True):
        assert (a["cp"], a["pf"], a["status"]) == (b["cp"], b["pf"], b["status"])


def test_device_resident_with_numpy_head_is_refused(naflex_bundle, tmp_path):
    res = CliRunner().invoke(
        run_main,
        [
            str(EXAMPLES / "pairs.csv"),
            "--bundle",
            str(naflex_bundle),
            "--out",
            str(tmp_path / "o.csv"),
            "--device-resident",
            "--cp-head",
            "numpy",
        ],
    )
    assert res.exit_code != 0 and "cp_head='graph'" in res.output
