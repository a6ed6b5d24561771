"""Masks optional: the segmenter through masc-run, the Python API, masc-serve, masc-rank and the
report, on the shipped photos with a random-weight CLIPSeg (random:clipseg-tiny) and the tiny
random-weight SigLIP2 bundle.

A pairs file with image and prompt columns only scores every row; the masks it saves are the
transformers + Pillow reference's of the recipe; CP/PF from them are masc-metric's given the same
masks; a second run segments nothing (the mask cache); resume, bad rows and the report behave as
with file masks.
"""

from __future__ import annotations

import csv
import json
import math
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from doubles.runners import CountingRunner
from support import EXAMPLES, oracle_for, read_rows
from masc_engine.jobs.pairs import RunOptions, PairsJob, RunSettings, run_pairs
from masc_engine.jobs.results import SettingsChangedError, read_output
from masc_engine.runtime.io import load_mask
from masc_engine.runtime.scorer import Scorer
from masc_engine.runtime.segmenter import MaskRecipe, Segmenter, SegmenterConfig
from masc_engine.tolerances import (
    FLOAT32_SAME_ARITHMETIC_ATOL,
    ORACLE_SCORE_ATOL,
    SEGMENTER_MASK_PROB_ATOL,
    SEGMENTER_REFERENCE_MIN_IOU,
)

MASKS = ("ref_mask", "out_mask")
#: What a pairs file needs when a segmenter makes its masks: the images, the prompt and the subject
#: name (the segmenter's prompt and the PF prompt's stripped part).
MINIMAL = ("ref_image", "out_image", "prompt", "object_name")


#: Per segmenter made here: the items each of its graphs ran on.
GRAPH_RUNS: dict = {}


def _segmenter(seg_bundle, **kw) -> Segmenter:
    """The segmenter masc-run builds from ``--segmenter`` and the recipe options, its graph runs
    counted (:data:`GRAPH_RUNS`)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        seg = SegmenterConfig(str(seg_bundle), **kw).load()
    counts, make = Counter(), seg.bundle.runner
    seg.bundle.runner = lambda graph, **options: CountingRunner(make(graph, **options), counts, graph)
    GRAPH_RUNS[id(seg)] = counts
    return seg


def _runs(seg: Segmenter) -> Counter:
    return GRAPH_RUNS[id(seg)]


def _scorer(bundle) -> Scorer:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Scorer(bundle)


def _write_pairs(
    path: Path, rows: list[dict], drop: tuple[str, ...] = MASKS, keep: tuple[str, ...] | None = None
) -> Path:
    """The shipped pairs with absolute paths, without the columns in ``drop`` (only those in
    ``keep``, when given)."""
    cols = [c for c in rows[0] if c not in drop and (keep is None or c in keep)]
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, cols)
        w.writeheader()
        for r in rows:
            w.writerow(
                {c: (str(EXAMPLES / r[c]) if c in ("ref_image", "out_image", *MASKS) and r[c] else r[c]) for c in cols}
            )
    return path


def _distinct(rows: list[dict]) -> tuple[set, set]:
    """Distinct images, and distinct (image, subject) pairs, a run must segment."""
    pairs = {(r[c], r["object_name"]) for r in rows for c in ("ref_image", "out_image")}
    return {p for p, _ in pairs}, pairs


@pytest.fixture(scope="module")
def seg_run(naflex_bundle, seg_bundle, tmp_path_factory):
    """masc-run's job on the shipped pairs with the images, prompt and subject name only (no mask
    columns, no key), masks saved and cached."""
    work = tmp_path_factory.mktemp("seg-run")
    pairs = _write_pairs(work / "pairs.csv", read_rows(EXAMPLES), keep=MINIMAL)
    seg = _segmenter(seg_bundle)
    summary = run_pairs(
        pairs,
        _scorer(naflex_bundle),
        work / "out.csv",
        RunSettings(save_masks=str(work / "masks")),
        options=RunOptions(cache_dir=work / "cache", chunk_size=8, progress=False),
        segmenter=seg,
    )
    return {
        "work": work,
        "pairs": pairs,
        "out": work / "out.csv",
        "rows": read_output(work / "out.csv"),
        "summary": summary,
        "seg": seg,
        "cache": work / "cache",
    }


def _saved(run: dict, row: dict, side: str) -> np.ndarray:
    return load_mask(str(run["work"] / row[f"{side}_mask_saved"]))


# ------------------------------------------------------------------ masc-run


def test_pairs_without_mask_columns_score_every_row(seg_run):
    rows, inputs = seg_run["rows"], read_rows(EXAMPLES)
    assert len(rows) == len(inputs) == 20 and {r["status"] for r in rows} == {"ok"}
    assert not {"ref_mask", "out_mask", "key", "subject"} & set(rows[0])  # input columns as they were
    assert [r["out_image"] for r in rows] == [str(EXAMPLES / r["out_image"]) for r in inputs]
    for r in rows:
        assert (r["ref_mask_source"], r["out_mask_source"]) == ("segmenter", "segmenter")
        for side in ("ref", "out"):
            m = _saved(seg_run, r, side)
            im = Image.open(r[f"{side}_image"])
            assert m.shape == (im.height, im.width) and set(np.unique(m)) <= {0, 255}
            assert float(r[f"{side}_mask_coverage"]) == pytest.approx((m > 0).mean(), abs=FLOAT32_SAME_ARITHMETIC_ATOL)
    # each (image, subject) segmented once, a reference shared by several rows too, whatever the
    # chunks (the mask memory); the vision graph runs once per image and chunk that needs a new mask
    images, pairs = _distinct(inputs)
    seg, summary = seg_run["seg"], seg_run["summary"]
    assert summary.masks["masks_segmented"] == len(pairs) == 24 and len(images) == 22
    runs = _runs(seg)
    assert len(images) <= runs["vision"] <= len(pairs) and runs["vision"] == seg.images_encoded
    assert runs["decoder"] == len(pairs)
    # each subject name through the text graph once, though loader threads ask for it at once
    assert runs["text"] == seg.texts_encoded == len({r["object_name"] for r in inputs})
    meta = json.loads((seg_run["out"].parent / "out.csv.meta.json").read_text())
    assert meta["segmenter"]["recipe"] == MaskRecipe().describe() and meta["counts"]["masks_segmented"] == len(pairs)
    assert meta["identity"]["--segmenter"] == seg.fingerprint and meta["identity"]["--mask-threshold"] == 0.5
    assert meta["settings"]["save_masks"] == str(seg_run["work"] / "masks")


def test_saved_masks_equal_the_transformers_pillow_reference(seg_run, reference_model):
    """The masks masc-run wrote are the recipe's: IoU >= 0.99 with transformers + torch.sigmoid +
    Pillow, and equal wherever the reference probability is farther than
    SEGMENTER_MASK_PROB_ATOL from the threshold (tests/test_segmenter.py measures the band)."""
    from masc_engine.export.segmenter_reference import reference_probabilities

    model, processor = reference_model
    done = {}
    for r in seg_run["rows"]:
        for side in ("ref", "out"):
            done[(r[f"{side}_image"], r["object_name"])] = _saved(seg_run, r, side)
    keys = sorted(done)
    images = [Image.open(p).convert("RGB") for p, _ in keys]
    probs = reference_probabilities(model, processor, images, [s for _, s in keys], MaskRecipe())
    for key, p in zip(keys, probs):
        ours, ref = done[key] > 0, p > np.float32(0.5)
        assert np.count_nonzero(ours & ref) / max(np.count_nonzero(ours | ref), 1) >= SEGMENTER_REFERENCE_MIN_IOU, key
        far = np.abs(p - np.float32(0.5)) > SEGMENTER_MASK_PROB_ATOL
        assert np.array_equal(ours[far], ref[far]) and far.mean() > 0.95, key


@pytest.mark.oracle
@pytest.mark.slow  # 11-16 s alone on 2 shared cores, most of it loading masc-metric (shared per session)
def test_scores_from_segmenter_masks_equal_the_oracle(seg_run, naflex_bundle):
    """CP and PF masc-run computed with the segmenter's masks are masc-metric's given those masks."""
    ref = oracle_for(naflex_bundle)
    worst = 0.0
    for r in seg_run["rows"]:
        want = ref.score(
            Image.open(r["ref_image"]),
            _saved(seg_run, r, "ref"),
            Image.open(r["out_image"]),
            _saved(seg_run, r, "out"),
            r["prompt"],
            r["object_name"],
        )
        worst = max(worst, abs(float(r["cp"]) - want.cp), abs(float(r["pf"]) - want.pf))
    assert worst <= ORACLE_SCORE_ATOL


def test_a_second_run_segments_nothing(seg_run, naflex_bundle, seg_bundle):
    """Same --cache-dir, another output: every mask from the store, not one image through the
    segmenter, the same scores; another threshold is another rule: nothing reused."""
    seg = _segmenter(seg_bundle)
    out = seg_run["work"] / "again.csv"
    summary = run_pairs(
        seg_run["pairs"],
        _scorer(naflex_bundle),
        out,
        options=RunOptions(cache_dir=seg_run["cache"], progress=False),
        segmenter=seg,
    )
    assert _runs(seg) == Counter() and seg.images_encoded == 0 and seg.texts_encoded == 0
    assert summary.masks["mask_cache_hits"] == seg_run["summary"].masks["masks_segmented"]
    assert summary.masks["masks_segmented"] == 0
    for a, b in zip(read_output(out), seg_run["rows"]):
        assert (a["cp"], a["pf"], a["ref_mask_coverage"]) == (b["cp"], b["pf"], b["ref_mask_coverage"])
    other = _segmenter(seg_bundle, threshold=0.4)
    run_pairs(
        seg_run["pairs"],
        _scorer(naflex_bundle),
        seg_run["work"] / "t04.csv",
        options=RunOptions(cache_dir=seg_run["cache"], progress=False),
        segmenter=other,
    )
    assert _runs(other)["vision"] == other.images_encoded == len(_distinct(read_rows(EXAMPLES))[0])


def test_empty_mask_cells_beside_file_masks(seg_run, naflex_bundle, seg_bundle, tmp_path):
    """Rows with mask files keep them (the scores of a run without a segmenter, exactly); rows with
    empty mask cells get the segmenter's (the scores of the run without mask columns, exactly)."""
    rows = read_rows(EXAMPLES)
    for i, r in enumerate(rows):
        if i % 2:
            r["ref_mask"] = ""
        if i % 3 == 0:
            r["out_mask"] = ""
    pairs = _write_pairs(tmp_path / "pairs.csv", rows, drop=())
    run_pairs(
        pairs,
        _scorer(naflex_bundle),
        tmp_path / "mixed.csv",
        options=RunOptions(cache_dir=seg_run["cache"], progress=False),
        segmenter=_segmenter(seg_bundle),
    )
    files = tmp_path / "files.csv"
    run_pairs(
        _write_pairs(tmp_path / "all.csv", read_rows(EXAMPLES), drop=()),
        _scorer(naflex_bundle),
        files,
        options=RunOptions(progress=False),
    )
    mixed, by_file, by_seg = read_output(tmp_path / "mixed.csv"), read_output(files), seg_run["rows"]
    for i, (m, f, s) in enumerate(zip(mixed, by_file, by_seg)):
        assert (m["ref_mask_source"], m["out_mask_source"]) == (
            "segmenter" if i % 2 else "file",
            "segmenter" if i % 3 == 0 else "file",
        )
        for side in ("ref", "out"):
            want = s if m[f"{side}_mask_source"] == "segmenter" else f
            assert m[f"{side}_mask_coverage"] == want[f"{side}_mask_coverage"]
        if not i % 2 and i % 3:
            assert (m["cp"], m["pf"]) == (f["cp"], f["pf"])
        if i % 2 and i % 3 == 0:
            assert (m["cp"], m["pf"]) == (s["cp"], s["pf"])
    assert "ref_mask_source" not in by_file[0]  # without a segmenter the output is what it always was


def test_bad_rows_with_a_segmenter(naflex_bundle, seg_bundle, seg_run, tmp_path):
    """Each bad row costs only itself: no subject and no mask (no_mask_source), a subject over the
    segmenter's prompt budget, a missing image, an unreadable one; a row without a subject but
    with masks is scored (PF unstripped), a row with one mask keeps it."""
    base = read_rows(EXAMPLES)[0]
    (tmp_path / "broken.jpg").write_bytes(b"not an image")
    cases = [
        ({"object_name": ""}, "no_mask_source", ("", "")),
        ({"object_name": "", "ref_mask": base["ref_mask"], "out_mask": base["out_mask"]}, "ok", ("file", "file")),
        ({"object_name": " ".join(["backpack"] * 90)}, "mask_prompt_too_long", ("", "")),
        ({"out_image": "images/backpack/gone.jpg"}, "missing_file", ("segmenter", "segmenter")),
        ({"ref_image": str(tmp_path / "broken.jpg")}, "unreadable_image", ("segmenter", "segmenter")),
        ({"ref_mask": base["ref_mask"]}, "ok", ("file", "segmenter")),
        ({}, "ok", ("segmenter", "segmenter")),
    ]
    rows = [{**base, "ref_mask": "", "out_mask": "", **change} for change, _, _ in cases]
    pairs = _write_pairs(tmp_path / "pairs.csv", rows, drop=())
    out = tmp_path / "out.jsonl"
    summary = run_pairs(
        pairs,
        _scorer(naflex_bundle),
        out,
        options=RunOptions(cache_dir=seg_run["cache"], progress=False),
        segmenter=_segmenter(seg_bundle),
    )
    got = read_output(out)
    for r, (_, status, sources) in zip(got, cases):
        assert (r["status"], r["ref_mask_source"], r["out_mask_source"]) == (status, *sources), r["status_detail"]
        assert math.isnan(r["cp"] if r["cp"] is not None else math.nan) == (status != "ok")
    assert "ref_mask: no mask given and no object_name" in got[0]["status_detail"]
    assert "no object_name: the PF prompt was not stripped" in got[1]["status_detail"]
    assert summary.rows == len(cases) and summary.ok == 3
    # without a segmenter, a missing mask column stops the run before any work, saying what to do
    from masc_engine.jobs.pairs import PairsFileError

    with pytest.raises(PairsFileError, match="--segmenter"):
        run_pairs(seg_run["pairs"], _scorer(naflex_bundle), tmp_path / "none.csv", options=RunOptions(progress=False))


def test_resume_and_settings_with_a_segmenter(naflex_bundle, seg_bundle, seg_run, tmp_path, monkeypatch):
    """An interrupted run finishes with the same command (the rows journaled are not scored
    again, the output equals the clean run's); another threshold, template or no segmenter on the
    same output is refused, naming what differs."""
    pairs, out = seg_run["pairs"], tmp_path / "out.csv"
    real, calls = PairsJob.score_chunk, []

    def stop_after_one(self, chunk, loaded=None):
        calls.append(1)
        if len(calls) > 1:
            raise KeyboardInterrupt
        return real(self, chunk, loaded)

    monkeypatch.setattr(PairsJob, "score_chunk", stop_after_one)
    with pytest.raises(KeyboardInterrupt):
        run_pairs(
            pairs,
            _scorer(naflex_bundle),
            out,
            options=RunOptions(chunk_size=8, progress=False),
            segmenter=_segmenter(seg_bundle),
        )
    monkeypatch.setattr(PairsJob, "score_chunk", real)
    seg = _segmenter(seg_bundle)
    summary = run_pairs(
        pairs, _scorer(naflex_bundle), out, options=RunOptions(chunk_size=8, progress=False), segmenter=seg
    )
    # the 8 journaled rows are not scored again: only the other rows' masks are made
    assert summary.resumed == 8 and _runs(seg)["decoder"] == len(_distinct(read_rows(EXAMPLES)[8:])[1])
    keep = ("cp", "pf", "status", "ref_mask_source", "out_mask_source", "ref_mask_coverage", "out_mask_coverage")
    assert [[r[k] for k in keep] for r in read_output(out)] == [[r[k] for k in keep] for r in seg_run["rows"]]
    for kw, said in (
        ({"threshold": 0.4}, "--mask-threshold: 0.5 -> 0.4"),
        ({"prompt_template": "a photo of a {}"}, "--mask-prompt-template: {} -> a photo of a {}"),
    ):
        with pytest.raises(SettingsChangedError, match=said.replace("{}", r"\{\}")):
            run_pairs(
                pairs,
                _scorer(naflex_bundle),
                out,
                options=RunOptions(progress=False),
                segmenter=_segmenter(seg_bundle, **kw),
            )
    with pytest.raises(SettingsChangedError, match=f"--segmenter: {seg.fingerprint} -> unset"):
        run_pairs(
            _write_pairs(tmp_path / "with_masks.csv", read_rows(EXAMPLES), drop=()),
            _scorer(naflex_bundle),
            out,
            options=RunOptions(progress=False),
        )


def test_fingerprint_covers_the_segmenter_and_keeps_runs_without_one(naflex_bundle, seg_bundle):
    s, seg = _scorer(naflex_bundle), _segmenter(seg_bundle)
    plain = RunSettings()
    base = plain.fingerprint(s, seg)
    assert base != plain.fingerprint(s)  # a segmenter run never shares a journal with a file-mask run
    assert "save_masks" not in plain.as_dict() and RunSettings(save_masks="m").as_dict()["save_masks"] == "m"
    for other in (_segmenter(seg_bundle, threshold=0.3), _segmenter(seg_bundle, prompt_template="the {}")):
        assert plain.fingerprint(s, other) != base
    assert RunSettings(save_masks="/x").fingerprint(s, seg) != base
    assert set(plain.identity(s, seg)) - set(plain.identity(s)) == {
        "--segmenter",
        "--mask-threshold",
        "--mask-prompt-template",
        "--segmenter-provider",
        "--save-masks",
    }


def test_paper_filter_reads_the_segmenter_masks_coverage(seg_run, naflex_bundle, seg_bundle):
    rows = seg_run["rows"]
    frac = float(np.median([float(r["out_mask_coverage"]) for r in rows]))
    out = seg_run["work"] / "filtered.csv"
    run_pairs(
        seg_run["pairs"],
        _scorer(naflex_bundle),
        out,
        RunSettings(min_output_mask_frac=frac),
        options=RunOptions(cache_dir=seg_run["cache"], progress=False),
        segmenter=_segmenter(seg_bundle),
    )
    got = read_output(out)
    for r, base in zip(got, rows):
        low = float(base["out_mask_coverage"]) < frac
        assert r["status"] == ("filtered_output_mask" if low else "ok")
    assert 0 < sum(r["status"] == "filtered_output_mask" for r in got) < len(got)


def test_mask_store_round_trip_and_keys(tmp_path, seg_bundle):
    from masc_engine.jobs.mask_source import SegmenterMasks
    from masc_engine.runtime.cache import EncodingStore

    store = EncodingStore(tmp_path / "c", {"any": "namespace"})
    m = (np.random.default_rng(0).random((37, 53)) > 0.5).astype(np.uint8) * 255
    store.put_mask("k", m, "onnxruntime/cpu")
    assert np.array_equal(store.get_mask("k", "onnxruntime/cpu"), m)
    assert store.get_mask("k", "onnxruntime/cuda") is None  # another provider's pixels are not these
    other = EncodingStore(tmp_path / "c", {"another": "scorer"})
    assert np.array_equal(other.get_mask("k", "onnxruntime/cpu"), m)  # masks do not depend on the scorer
    masks = SegmenterMasks(_segmenter(seg_bundle), "apply", store)
    assert masks.key("d" * 64, "cat") != SegmenterMasks(masks.segmenter, "ignore").key("d" * 64, "cat")
    im = Image.open(EXAMPLES / "images" / "cat" / "00.jpg").convert("RGB")
    first = masks(im, "d" * 64, "cat/00.jpg", ["cat", "cat", ""])
    assert masks.masks_segmented == 1 and first[""].reason == "no_mask_source"
    again = masks(im, "d" * 64, "cat/00.jpg", ["cat"])
    assert masks.memory_hits == 1 and np.array_equal(again["cat"].mask, first["cat"].mask)
    fresh = SegmenterMasks(masks.segmenter, "apply", store)
    assert np.array_equal(fresh(im, "d" * 64, "x", ["cat"])["cat"].mask, first["cat"].mask)
    assert fresh.mask_cache_hits == 1 and fresh.masks_segmented == 0
    store.close()
    other.close()


def test_ray_workers_build_the_segmenter(seg_run, naflex_bundle, seg_bundle):
    """The Ray factory is picklable and builds a job with the driver's resolved segmenter, which
    scores a chunk as the driver's job does."""
    import pickle

    from masc_engine.jobs.executors import Chunk
    from masc_engine.jobs.pairs import _ray_factory

    seg = _segmenter(seg_bundle, threshold=0.5)
    factory = pickle.loads(pickle.dumps(_ray_factory(_scorer(naflex_bundle), RunSettings(), 1, segmenter=seg)))
    job = factory()
    assert job.masks is not None and job.masks.segmenter.identity() == seg.identity()
    rows = [dict(r) for r in read_rows(EXAMPLES)[:3]]
    for r in rows:
        r.update(
            ref_image=str(EXAMPLES / r["ref_image"]), out_image=str(EXAMPLES / r["out_image"]), ref_mask="", out_mask=""
        )
    got = job.score_chunk(Chunk((1, 2, 3), tuple(rows), ("a", "b", "c"), str(EXAMPLES)))
    assert [(r["cp"], r["pf"]) for r in got] == [(float(r["cp"]), float(r["pf"])) for r in seg_run["rows"][:3]]


# ------------------------------------------------------------------ the command line


def test_masc_run_command_line(seg_run, naflex_bundle, seg_bundle, tmp_path):
    from masc_engine.cli.run_cmd import main

    out = tmp_path / "cli.csv"
    args = [str(seg_run["pairs"]), "--bundle", str(naflex_bundle), "--out", str(out), "--no-progress"]
    res = CliRunner().invoke(
        main,
        [
            *args,
            "--segmenter",
            str(seg_bundle),
            "--save-masks",
            str(tmp_path / "m"),
            "--cache-dir",
            str(seg_run["cache"]),
        ],
    )
    assert res.exit_code == 0, res.output
    assert "masks: 0 segmented" in res.output and "from the cache" in res.output
    got = read_output(out)
    assert [(r["cp"], r["pf"]) for r in got] == [(r["cp"], r["pf"]) for r in seg_run["rows"]]
    assert all((out.parent / r["ref_mask_saved"]).is_file() for r in got)
    for extra, said in (
        (["--save-masks", "m"], "--save-masks"),
        (["--mask-threshold", "0.4"], "--mask-threshold"),
        (["--segmenter", str(seg_bundle), "--mask-prompt-template", "a {} {}"], "exactly one"),
    ):
        res = CliRunner().invoke(main, [*args, *extra])
        assert res.exit_code == 2 and said in res.output, res.output
    res = CliRunner().invoke(main, args)  # mask columns absent, no segmenter: one line saying what to do
    assert res.exit_code == 1 and "--segmenter" in res.output


# ------------------------------------------------------------------ the Python API


def test_api_masks_optional(seg_run, naflex_bundle, seg_bundle):
    from masc_engine import MaSC, Pair
    from masc_engine.errors import InputError

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = MaSC(naflex_bundle, segmenter=seg_bundle)
    row = seg_run["rows"][0]
    ref, out = Image.open(row["ref_image"]), Image.open(row["out_image"])
    res = m.score(ref_image=ref, out_image=out, prompt=row["prompt"], object_name=row["object_name"])
    assert (res.cp, res.pf) == (float(row["cp"]), float(row["pf"]))  # masc-run's, exactly
    assert np.array_equal(res.masks["ref_mask"], _saved(seg_run, row, "ref"))
    assert (res.extras["ref_mask_source"], res.extras["out_mask_source"]) == ("segmenter", "segmenter")
    given = m.score(ref, res.masks["ref_mask"], out, None, row["prompt"], row["object_name"])
    assert (given.cp, given.pf) == (res.cp, res.pf) and given.extras["ref_mask_source"] == "file"
    batch = m.score_batch([Pair(ref, None, out, None, row["prompt"], row["object_name"])] * 2)
    assert [(b.cp, b.pf) for b in batch] == [(res.cp, res.pf)] * 2
    assert m.segmenter.images_encoded == 2 + 1 + 2  # per call, each image object once
    with pytest.raises(InputError, match="no object_name"):
        m.score(ref_image=ref, out_image=out, prompt="a photo")
    with pytest.raises(TypeError, match="segmenter="):
        _scorer(naflex_bundle).score(ref_image=ref, out_image=out, prompt="a photo", object_name="cat")
    with pytest.raises(TypeError, match="segmenter must be"):
        MaSC(naflex_bundle, segmenter=3)


# ------------------------------------------------------------------ masc-serve, masc-rank, the report


@pytest.mark.slow
def test_serve_with_a_segmenter(seg_run, naflex_bundle, seg_bundle, tmp_path):
    """Mask fields optional, the OpenAPI document says so; a request without masks gets masc-run's
    record for the row (the segmenter's masks, their source); no subject: 422 naming the mask."""
    httpx = pytest.importorskip("httpx", reason="the serve tests need httpx (test extra)")
    pytest.importorskip("fastapi", reason="masc-serve needs the serve extra")
    import base64

    from test_serve import Server

    server = Server(naflex_bundle, "--segmenter", str(seg_bundle), log=tmp_path / "serve.log")
    try:
        doc = httpx.get(server.url + "/openapi.json").json()
        item = doc["components"]["schemas"]["ScoreItem"]
        assert item["required"] == ["ref_image", "out_image", "prompt"]
        assert "segmenter" in item["properties"]["ref_mask"]["description"]
        ready = httpx.get(server.url + "/readyz").json()
        assert ready["segmenter"]["fingerprint"] == seg_run["seg"].fingerprint
        row = seg_run["rows"][4]
        b64 = {k: base64.b64encode(Path(row[k]).read_bytes()).decode() for k in ("ref_image", "out_image")}
        fields = {"prompt": row["prompt"], "object_name": row["object_name"]}
        r = httpx.post(server.url + "/v1/score", json={**b64, **fields}, timeout=60).json()
        assert (r["cp"], r["pf"], r["ref_mask_source"]) == (float(row["cp"]), float(row["pf"]), "segmenter")
        files = {k: Path(row[k]).read_bytes() for k in ("ref_image", "out_image")}
        mp = httpx.post(server.url + "/v1/score", files=files, data=fields, timeout=60)
        assert mp.status_code == 200 and mp.json()["cp"] == r["cp"]
        bad = httpx.post(server.url + "/v1/score", json={**b64, "prompt": row["prompt"]}, timeout=60)
        assert bad.status_code == 422 and (bad.json()["error"], bad.json()["field"]) == ("no_mask_source", "ref_mask")
    finally:
        server.stop()


def test_serve_without_a_segmenter_requires_masks(naflex_bundle):
    pytest.importorskip("fastapi", reason="masc-serve needs the serve extra")
    from masc_engine.serve.app import ServeConfig, create_app

    item = create_app(ServeConfig(bundle=str(naflex_bundle))).openapi()["components"]["schemas"]["ScoreItem"]
    assert {"ref_mask", "out_mask"} <= set(item["required"])


def test_rank_query_masks_from_the_segmenter(seg_run, naflex_bundle, seg_bundle, tmp_path):
    """masc-rank --similarity maxcos: a query without a mask gets the segmenter's, the very mask
    masc-run saved; ranking with it equals ranking with that mask given as a file."""
    from masc_engine.jobs.rank import run_rank
    from masc_engine.jobs.rank_encoders import EngineEncoder

    rows, inputs = seg_run["rows"][:5], read_rows(EXAMPLES)[:5]
    fields = ["image", "identity", "method", "object_name", "mask"]
    with_seg, with_files = tmp_path / "q_seg.csv", tmp_path / "q_files.csv"
    for path, mask in ((with_seg, lambda r: ""), (with_files, lambda r: str(seg_run["work"] / r["out_mask_saved"]))):
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fields)
            w.writeheader()
            for r, given in zip(rows, inputs):
                w.writerow(
                    {
                        "image": r["out_image"],
                        "identity": given["subject"],
                        "method": given["method"],
                        "object_name": r["object_name"],
                        "mask": mask(r),
                    }
                )
    enc = EngineEncoder(_scorer(naflex_bundle))
    a = run_rank(
        EXAMPLES / "gallery.csv", enc, queries_csv=with_seg, similarity="maxcos", segmenter=_segmenter(seg_bundle)
    )
    b = run_rank(EXAMPLES / "gallery.csv", enc, queries_csv=with_files, similarity="maxcos")
    assert [r["mask_source"] for r in a.rows] == ["segmenter"] * 5 and a.extra_columns == ["mask_source"]
    assert [(r["ap"], r["n_query_patches"]) for r in a.rows] == [(r["ap"], r["n_query_patches"]) for r in b.rows]
    with pytest.raises(ValueError, match="maxcos"):
        run_rank(EXAMPLES / "gallery.csv", enc, queries_csv=with_seg, segmenter=_segmenter(seg_bundle))


def test_report_shows_mask_sources_and_overlays(seg_run):
    import re

    from masc_engine.report import page as rp

    rows, meta = rp.load_scores(seg_run["out"])
    # the shipped photos live outside the run's folder: allowed as an image root, as --image-root does
    options = rp.ReportOptions(top_k=3, n_resamples=50, image_roots=(str(EXAMPLES),))
    text = rp.build_report(rows, meta, scores_path=seg_run["out"], options=options)
    block = re.search(r'<div id="masks">.*?</table>', text, re.S).group(0)
    assert 'data-source="segmenter">20<' in block and "file" not in re.findall(r"<th[^>]*>([^<]*)</th>", block)
    assert text.count('data-mask-source="segmenter"') == 4 * 3 * 2 and 'class="ph"' not in text
    assert "reference · segmenter mask" in text and "output · segmenter mask" in text
    assert rp.mask_sources(rp.prepare_rows(rows))["output"] == {"segmenter": 20}
    # a run without saved masks says so; a file-mask run has no mask-source block
    unsaved = [{k: v for k, v in r.items() if not k.endswith("_saved")} for r in rows]
    assert "segmenter mask (not saved)" in rp.build_report(unsaved, meta, scores_path=seg_run["out"])
    plain = [{k: v for k, v in r.items() if "mask_s" not in k} for r in rows]
    assert 'id="masks"' not in rp.build_report(plain, None, scores_path=seg_run["out"])
