"""The pairs job's in-memory path (jobs/items.py, PairsJob.decode_pair / check_pair /
score_decoded): files reduced at once to what scoring needs, under a decoded-bytes budget, a
per-call stripper, and records equal to masc-run's."""

from __future__ import annotations

import io
import random
import threading
import time

import numpy as np
import pytest
from PIL import Image

from support import EXAMPLES
from masc_engine.jobs import loading
from masc_engine.jobs.items import DecodedImage, DecodedMask, PairError
from masc_engine.jobs.loading import ByteBudget
from masc_engine.jobs.pairs import RunOptions, RESULT_COLUMNS, PairsJob, RunSettings, run_pairs
from masc_engine.jobs.results import read_output
from masc_engine.runtime.io import decode_cost, open_image
from masc_engine.runtime.scorer import Scorer

FILES = ("ref_image", "ref_mask", "out_image", "out_mask")


def _files(row: dict) -> dict:
    return {c: (EXAMPLES / row[c]).read_bytes() for c in FILES}


def _rows(n: int = 6) -> list[dict]:
    import csv

    return list(csv.DictReader(open(EXAMPLES / "pairs.csv", encoding="utf-8")))[:n]


# ------------------------------------------------------------------ the budget


def test_byte_budget_never_holds_more_than_its_bound(monkeypatch):
    trims = []
    monkeypatch.setattr(loading, "release_free_memory", lambda: trims.append(1) or True)
    budget = ByteBudget(100, trim_after=150)
    seen, lock = [], threading.Lock()
    rng = random.Random(0)
    sizes = [rng.randint(1, 100) for _ in range(60)] + [500]  # the last alone costs more than the budget

    def work(n):
        with budget.reserve(n):
            with lock:
                seen.append(budget.in_use)
            time.sleep(0.001)

    threads = [threading.Thread(target=work, args=(n,)) for n in sizes]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(seen) == len(sizes) and max(seen) <= 100 and budget.peak <= 100 and budget.in_use == 0
    assert trims  # the budget fell idle after more than trim_after bytes went through it


def test_decode_cost_bounds_what_decoding_holds():
    """The reservation is known from the header alone and covers at least the decoded pixels."""
    for mode, shape in (("RGB", (300, 200, 3)), ("L", (300, 200)), ("I;16", (300, 200))):
        arr = np.zeros(shape, np.uint16 if mode == "I;16" else np.uint8)
        b = io.BytesIO()
        Image.fromarray(arr).save(b, "PNG")
        im = open_image(b.getvalue(), "x.png")
        assert im.size == (200, 300)
        for kind in ("image", "mask"):
            assert decode_cost(im, kind) >= 200 * 300 * (4 if mode == "RGB" else 1) * 2


def test_decoding_under_a_budget_reserves_each_file(naflex_bundle):
    job = PairsJob(Scorer(naflex_bundle), decode_budget=ByteBudget(2**30))
    rows = _rows(4)
    pairs = []
    threads = [
        threading.Thread(target=lambda r=r: pairs.append(job.decode_pair(_files(r), r["prompt"], r["object_name"])))
        for r in rows
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(pairs) == 4 and job.decode_budget.in_use == 0
    im = Image.open(EXAMPLES / rows[0]["ref_image"])
    assert job.decode_budget.peak >= im.width * im.height * 4  # at least one file's pixels were reserved


# ------------------------------------------------------------------ reduced items


def test_decoded_pairs_hold_no_full_resolution_pixels(naflex_bundle):
    """Only the preprocessed patches and the masks' weights on the patch grid stay after decoding
    (the PIL image is kept only when attribution maps are drawn)."""
    row = _rows(1)[0]
    job = PairsJob(Scorer(naflex_bundle))
    p = job.decode_pair(_files(row), row["prompt"], row["object_name"])
    assert isinstance(p.ref_image, DecodedImage) and p.ref_image.image is None and p.out_image.image is None
    assert isinstance(p.ref_mask, DecodedMask)
    w, h = Image.open(EXAMPLES / row["ref_mask"]).size
    assert p.ref_mask.size == (w, h) and set(p.ref_mask.weights) == {p.ref_image.grid}
    assert p.ref_mask.weights[p.ref_image.grid].size == p.ref_image.grid[0] * p.ref_image.grid[1]
    assert p.ref_image.pre.spatial_shape == p.ref_image.grid
    with_maps = PairsJob(job.scorer, RunSettings(save_maps="unused"))
    assert with_maps.decode_pair(_files(row), row["prompt"], row["object_name"]).ref_image.image is not None


def test_score_decoded_is_masc_runs_record_and_batch_independent(naflex_bundle, tmp_path):
    """Pairs decoded from bytes and scored together give, field for field, the records masc-run
    writes for the same files; scored one at a time, the same bits."""
    scorer = Scorer(naflex_bundle)
    out = tmp_path / "s.jsonl"
    run_pairs(EXAMPLES / "pairs.csv", scorer, out, options=RunOptions(progress=False))
    written = read_output(out)[:6]
    job = PairsJob(scorer)
    pairs = [job.decode_pair(_files(r), r["prompt"], r["object_name"], row_index=r["row_index"]) for r in written]
    together = job.score_decoded(pairs)
    alone = [job.score_decoded([p])[0] for p in pairs]
    for got, one, want in zip(together, alone, written, strict=True):
        for k in RESULT_COLUMNS:
            if k in ("row_key",):
                continue
            assert got.get(k) == want.get(k) or (got[k] != got[k] and want[k] != want[k]), (k, got.get(k), want[k])
            assert got.get(k) == one.get(k) or got[k] != got[k], k


def test_the_stripper_is_a_per_call_argument(naflex_bundle):
    """Items decoded with different strippers, scored in one call, each get their own PF prompt
    and the scores a scorer made with that stripper gives (no copy of the scorer)."""
    row = {**_rows(1)[0], "prompt": "a cat sitting on a red sofa", "object_name": "cat"}
    job = PairsJob(Scorer(naflex_bundle))  # its default: regex
    regex = job.decode_pair(_files(row), row["prompt"], row["object_name"])
    none = job.decode_pair(_files(row), row["prompt"], row["object_name"], stripper="none")
    a, b = job.score_decoded([regex, none])
    assert a["prompt_text"] != row["prompt"] and b["prompt_text"] == row["prompt"]
    other = PairsJob(Scorer(naflex_bundle, stripper="none")).score_item(
        *_files(row).values(), row["prompt"], row["object_name"]
    )
    assert (b["cp"], b["pf"], b["prompt_text"]) == (other["cp"], other["pf"], other["prompt_text"])


def test_check_pair_names_the_field_at_fault(naflex_bundle):
    row = _rows(1)[0]
    job = PairsJob(Scorer(naflex_bundle))
    files = _files(row)
    b = io.BytesIO()
    Image.fromarray(np.zeros((40, 50), np.uint8)).save(b, "PNG")
    bad = job.decode_pair(
        {**files, "out_mask": b.getvalue()}, row["prompt"], row["object_name"], names={"out_mask": "items[4].out_mask"}
    )
    with pytest.raises(PairError) as e:
        job.check_pair(bad)
    assert (e.value.reason, e.value.field) == ("mask_size_mismatch", "out_mask")
    assert "items[4].out_mask is 50x40" in e.value.detail
    broken = job.decode_pair({**files, "ref_image": b"%!PS-Adobe-3.0\n"}, row["prompt"], row["object_name"])
    with pytest.raises(PairError) as e:
        job.check_pair(broken)
    assert (e.value.reason, e.value.field) == ("unreadable_image", "ref_image")


@pytest.mark.slow
def test_measured_decoding_peaks_stay_within_decode_cost():
    """bench/decode_memory.py on 1500- and 300-pixel files: for every mode and kind, the RSS peak of
    decoding and reducing one file (a fresh process each) is at most what decode_cost reserves."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "bench" / "decode_memory.py"
    spec = importlib.util.spec_from_file_location("decode_memory", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--size", "1500"]) == 0 and mod.main(["--size", "300"]) == 0
