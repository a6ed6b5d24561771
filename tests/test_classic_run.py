"""The classic metrics in one masc-run: embeddings cached by (image content, embedder identity) in
the ``--cache-dir`` store (counted by graph calls), rows without masks, another metric set on a
finished output, the Ray executor, masc-serve and the Python API with embedders."""

from __future__ import annotations

import csv
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from masc_engine.runtime.cache import EncodingStore, embedding_scope, open_cache
from masc_engine.runtime.embedder import EmbeddingCache

ROOT = Path(__file__).resolve().parents[1]
PAIRS = ROOT / "examples" / "dreambooth" / "pairs.csv"
KEYS = {"clip": "clip-tiny", "dino": "dino-tiny-s16"}
CLASSIC = ("clip_i", "clip_t", "dino")


# ---------------------------------------------------------------------- the store, no bundle


class _FakeEmbedder:
    """An embedder whose graph is a count: ``embed_preprocessed`` returns each image's mean."""

    dim = 3
    has_text = True

    def __init__(self, recipe: str = "a"):
        self.recipe, self.image_calls, self.text_calls = recipe, 0, 0

    def identity(self) -> dict:
        return {"fingerprint": "f", "recipe": self.recipe}

    def embed_preprocessed(self, pixels):
        self.image_calls += 1
        return np.stack([np.full(3, float(p.mean()), np.float32) for p in pixels])

    def embed_texts(self, texts):
        self.text_calls += 1
        return np.stack([np.full(3, float(len(t)), np.float32) for t in texts])


def test_embeddings_round_trip_and_a_forged_entry_is_a_refused_miss(tmp_path):
    store = EncodingStore(tmp_path / "c", {"bundle": "b"})
    scope = embedding_scope({"fingerprint": "f"}, "image")
    v = np.array([1.5, -2.0, 3.25], np.float32)
    store.put_embedding(scope, "k", v)
    np.testing.assert_array_equal(store.get_embedding(scope, "k", 3), v)
    assert store.get_embedding(scope, "k", 4) is None and store.refused == 1  # another width
    assert store.get_embedding(embedding_scope({"fingerprint": "g"}, "image"), "k") is None  # another embedder
    import pickle

    for forged in (
        pickle.dumps(v),
        b"masc-store/1\nemb\x01" + b"\x03" + b"\0" * 7 + b"\0" * 11,
        b"masc-store/1\ntxt\x01" + b"\x03" + b"\0" * 7 + v.tobytes(),
    ):
        store.cache.set(f"emb:{scope}:k", forged)
        before = store.refused
        assert store.get_embedding(scope, "k", 3) is None and store.refused == before + 1
    store.put_embedding(scope, "k", v)  # the next write replaces it
    np.testing.assert_array_equal(store.get_embedding(scope, "k", 3), v)
    store.close()


def test_a_second_cache_on_the_same_store_runs_no_graph_and_another_recipe_misses(tmp_path):
    store = EncodingStore(tmp_path / "c", {"bundle": "b"})
    pixels = {"a": np.ones((3, 2, 2), np.float32), "b": np.zeros((3, 2, 2), np.float32)}
    first = _FakeEmbedder()
    got = EmbeddingCache(first, store).images(pixels)
    texts = EmbeddingCache(first, store).texts(["x", "yy", "x"])
    assert first.image_calls == 1 and first.text_calls == 1 and set(texts) == {"x", "yy"}
    again = _FakeEmbedder()
    cache = EmbeddingCache(again, store)
    hit = cache.images(pixels)
    assert again.image_calls == 0 and cache.texts(["yy"])["yy"][0] == 2.0 and again.text_calls == 0
    assert all(np.array_equal(got[k], hit[k]) for k in pixels) and cache.cache_hits == 3
    other = _FakeEmbedder(recipe="b")  # another preprocessing recipe: another identity
    EmbeddingCache(other, store).images(pixels)
    assert other.image_calls == 1
    store.close()


# ---------------------------------------------------------------------- runs with bundles


@pytest.fixture(scope="module")
def bundles(embedder_bundles, naflex_bundle):
    """The session's clip and dino bundles (conftest ``embedder_bundles``: one export per preset)."""
    return {k: embedder_bundles[v] for k, v in KEYS.items()}


class _Counting:
    """A runner that counts its ``run`` calls."""

    def __init__(self, runner):
        self.runner, self.calls = runner, 0

    def __getattr__(self, name):
        return getattr(self.runner, name)

    def run(self, feeds):
        self.calls += 1
        return self.runner.run(feeds)


def _embedders(bundles, names=("clip", "dino")) -> tuple[dict, dict]:
    """Fresh embedders with counting runners: ``(embedders, {(name, graph): counter})``."""
    from masc_engine.runtime.embedder import Embedder

    embs, counters = {}, {}
    for k in names:
        e = embs[k] = Embedder(bundles[k])
        for g in e.GRAPHS:
            counters[(k, g)] = _Counting(e.runner(g))
            e.replace_runner(g, counters[(k, g)])
    return embs, counters


def _run(bundles, naflex_bundle, pairs, out, cache=None, metrics=CLASSIC, names=("clip", "dino"), **opts):
    from masc_engine.jobs.pairs import RunOptions, RunSettings, run_pairs
    from masc_engine.runtime.scorer import Scorer

    embs, counters = _embedders(bundles, names)
    summary = run_pairs(
        pairs,
        Scorer(naflex_bundle),
        out,
        RunSettings(metrics=metrics),
        RunOptions(progress=False, cache_dir=None if cache is None else str(cache), **opts),
        embedders=embs,
    )
    return summary, {k: c.calls for k, c in counters.items()}


def _rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _copy_examples(tmp_path: Path) -> Path:
    """The example pairs and their files under ``tmp_path`` (a second file with the same images)."""
    d = tmp_path / "copy"
    if not d.exists():
        shutil.copytree(PAIRS.parent, d, ignore=shutil.ignore_patterns("*.md"))
    return d / "pairs.csv"


@pytest.mark.slow
def test_a_second_run_or_file_on_the_same_cache_runs_no_embedder_graph(bundles, naflex_bundle, tmp_path):
    cache = tmp_path / "cache"
    s1, calls1 = _run(bundles, naflex_bundle, PAIRS, tmp_path / "a.csv", cache)
    assert all(n > 0 for n in calls1.values()) and s1.embeddings["images_embedded"] == 2 * 22
    s2, calls2 = _run(bundles, naflex_bundle, _copy_examples(tmp_path), tmp_path / "b.csv", cache)
    assert calls2 == dict.fromkeys(calls1, 0) and s2.images_encoded == 0
    assert s2.embeddings == {"images_embedded": 0, "texts_embedded": 0, "embedding_cache_hits": 2 * 22 + 20}
    plain, _ = _run(bundles, naflex_bundle, PAIRS, tmp_path / "nocache.csv")
    want = _rows(tmp_path / "nocache.csv")
    for got in (_rows(tmp_path / "a.csv"), _rows(tmp_path / "b.csv")):  # a hit is the stored bits
        assert [[r[c] for c in CLASSIC] for r in got] == [[r[c] for c in CLASSIC] for r in want]

    # Garbled entries (not the store's format): refused, embedded again, rewritten; same scores.
    store = open_cache(cache)
    keys = [k for k in store.iterkeys() if k.startswith("emb:")]
    assert len(keys) == 2 * 22 + 20
    for k in keys:
        store.set(k, b"masc-store/1\nemb\x01" + b"\xff" * 8)
    store.close()
    s3, calls3 = _run(bundles, naflex_bundle, PAIRS, tmp_path / "c.csv", cache)
    assert all(n > 0 for n in calls3.values()) and s3.embeddings["images_embedded"] == 2 * 22
    assert [[r[c] for c in CLASSIC] for r in _rows(tmp_path / "c.csv")] == [[r[c] for c in CLASSIC] for r in want]
    _, calls4 = _run(bundles, naflex_bundle, PAIRS, tmp_path / "d.csv", cache)
    assert calls4 == dict.fromkeys(calls1, 0)


def _without_masks(tmp_path: Path, drop_columns: bool) -> Path:
    """The example pairs with every second row's mask cells empty (or no mask columns at all)."""
    rows = _rows(PAIRS)
    cols = [c for c in rows[0] if not (drop_columns and c.endswith("_mask"))]
    out = _copy_examples(tmp_path).with_name(f"nomask{int(drop_columns)}.csv")
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, cols, extrasaction="ignore")
        w.writeheader()
        for i, r in enumerate(rows):
            if i % 2 and not drop_columns:
                r = {**r, "ref_mask": "", "out_mask": "" if i % 4 == 1 else r["out_mask"]}
            w.writerow(r)
    return out


@pytest.mark.slow
def test_rows_without_masks_get_the_classic_metrics_and_cp_pf_say_why(bundles, naflex_bundle, tmp_path):
    _run(bundles, naflex_bundle, PAIRS, tmp_path / "masked.csv")
    want = _rows(tmp_path / "masked.csv")
    for drop in (False, True):
        s, _ = _run(bundles, naflex_bundle, _without_masks(tmp_path, drop), tmp_path / f"o{drop}.csv")
        got = _rows(tmp_path / f"o{drop}.csv")
        assert len(got) == 20
        for i, (g, w) in enumerate(zip(got, want)):
            assert [g[c] for c in CLASSIC] == [w[c] for c in CLASSIC], i
            assert all(g[f"{c}_status"] == "ok" for c in CLASSIC)
            if drop or i % 2:
                assert g["cp_status"] == g["pf_status"] == g["status"] == "no_mask_source", g
                assert math.isnan(float(g["cp"])) and math.isnan(float(g["pf"]))
                assert "no segmenter" in g["status_detail"]
            else:
                assert (g["cp"], g["pf"], g["status"]) == (w["cp"], w["pf"], "ok")
        assert s.statuses.get("no_mask_source") == (20 if drop else 10)


@pytest.mark.slow
def test_adding_dino_to_a_finished_output_refuses_then_overwrite_runs_only_dino(bundles, naflex_bundle, tmp_path):
    from masc_engine.jobs.results import SettingsChangedError

    cache, out = tmp_path / "cache", tmp_path / "o.csv"
    _run(bundles, naflex_bundle, PAIRS, out, cache, metrics=("clip_i", "clip_t"), names=("clip",))
    shutil.copy(out, tmp_path / "first.csv")
    before = out.read_bytes()
    with pytest.raises(SettingsChangedError) as e:
        _run(bundles, naflex_bundle, PAIRS, out, cache)
    msg = str(e.value)
    assert "\n" not in msg and "--metrics: clip_i,clip_t -> clip_i,clip_t,dino" in msg and "--overwrite" in msg
    assert "--cache-dir" in msg and out.read_bytes() == before
    s, calls = _run(bundles, naflex_bundle, PAIRS, out, cache, overwrite=True)
    # Nothing computed before runs again: no SigLIP2 image, no CLIP graph; DINO once per distinct image.
    assert s.images_encoded == 0 and calls[("clip", "image")] == calls[("clip", "text")] == 0
    assert calls[("dino", "image")] > 0 and s.embeddings["images_embedded"] == 22
    rows = _rows(out)
    assert all(r["dino_status"] == "ok" for r in rows)
    assert [r["clip_i"] for r in rows] == [r["clip_i"] for r in _rows(tmp_path / "first.csv")]
    # The same command again resumes everything.
    s2, calls2 = _run(bundles, naflex_bundle, PAIRS, out, cache)
    assert s2.resumed == 20 and not any(calls2.values())


@pytest.mark.slow
def test_ray_with_embedders_writes_the_local_bytes(bundles, naflex_bundle, tmp_path):
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'masc-engine[ray]')")
    _run(bundles, naflex_bundle, PAIRS, tmp_path / "local.csv", chunk_size=8)
    s, _ = _run(
        bundles,
        naflex_bundle,
        PAIRS,
        tmp_path / "ray.csv",
        tmp_path / "cache",
        chunk_size=8,
        executor="ray",
        ray_workers=2,
    )
    assert s.rows == 20 and s.embeddings["images_embedded"] >= 22
    assert (tmp_path / "ray.csv").read_bytes() == (tmp_path / "local.csv").read_bytes()
    # The workers wrote the driver's store: a local run on it embeds nothing.
    _, calls = _run(bundles, naflex_bundle, PAIRS, tmp_path / "again.csv", tmp_path / "cache")
    assert not any(calls.values())


@pytest.mark.slow
def test_masc_run_cli_resumes_a_run_with_embedders_and_prints_their_counters(bundles, naflex_bundle, tmp_path):
    from masc_engine.cli.run_cmd import main

    out = tmp_path / "o.csv"
    args = [
        str(PAIRS),
        "--bundle",
        str(naflex_bundle),
        "--out",
        str(out),
        "--metrics",
        "cp,pf,clip_i,dino",
        "--embedder",
        f"clip={bundles['clip']}",
        "--embedder",
        f"dino={bundles['dino']}",
        "--no-progress",
        "--cache-dir",
        str(tmp_path / "cache"),
    ]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0 and "embeddings: 44 images and 0 prompts through the embedders" in res.output, res.output
    meta = json.loads(Path(f"{out}.meta.json").read_text())
    assert meta["counts"]["embeddings"]["images_embedded"] == 44
    # the per-method table has a count and mean for every metric of the run, the classic ones too
    head = next(ln for ln in res.output.splitlines() if ln.startswith("method "))
    assert [w for w in head.split() if w.isupper()] == ["CP", "CP", "PF", "PF", "CLIP_I", "CLIP_I", "DINO", "DINO"]
    assert "CLIP_T" not in head
    rows = _rows(out)
    for method in {r["method"] for r in rows}:
        line = next(ln for ln in res.output.splitlines() if ln.startswith(method + " "))
        cells = line.split()[2:]  # n and mean per metric
        for i, col in enumerate(("cp", "pf", "clip_i", "dino")):
            vals = [float(r[col]) for r in rows if r["method"] == method and r[col] not in ("", "nan")]
            assert cells[2 * i : 2 * i + 2] == [str(len(vals)), f"{sum(vals) / len(vals):.4f}"], (method, col, line)


def test_a_default_server_keeps_the_built_in_response_models():
    pytest.importorskip("fastapi")
    from masc_engine.jobs.pairs import RunSettings
    from masc_engine.serve.schemas import BatchResult, ScoreResult, result_models

    assert result_models(RunSettings().run_metrics()) == (ScoreResult, BatchResult)
    record, batch = result_models(RunSettings(metrics=("dino",)).run_metrics())
    assert record.__name__ == "ScoreResult" and {"dino", "dino_status"} <= set(record.model_fields)
    assert "clip_i" not in record.model_fields and batch.model_fields["results"].annotation == list[record]


@pytest.mark.slow
def test_masc_serve_and_the_python_api_carry_the_classic_metrics_of_masc_run(bundles, naflex_bundle, tmp_path):
    pytest.importorskip("fastapi")
    import base64

    from masc_engine.jobs.pairs import PairsJob, RunSettings
    from masc_engine.runtime.embedder import Embedder
    from masc_engine.runtime.scorer import Scorer
    from masc_engine.serve.app import ServeConfig, create_app
    from test_serve_openapi import _ready_client

    _run(bundles, naflex_bundle, PAIRS, tmp_path / "run.csv")
    want = _rows(tmp_path / "run.csv")[0]
    files = {c: (PAIRS.parent / want[c]).read_bytes() for c in ("ref_image", "ref_mask", "out_image", "out_mask")}

    # The Python API: PairsJob with embedders scores one in-memory pair as masc-run scores the row.
    job = PairsJob(
        Scorer(naflex_bundle),
        RunSettings(metrics=CLASSIC),
        embedders={k: Embedder(bundles[k]) for k in ("clip", "dino")},
    )
    rec = job.score_item(**files, prompt=want["prompt"], object_name=want["object_name"])
    assert [repr(rec[c]) for c in CLASSIC] == [want[c] for c in CLASSIC]
    bare = job.score_item(files["ref_image"], None, files["out_image"], None, want["prompt"], want["object_name"])
    assert [repr(bare[c]) for c in CLASSIC] == [want[c] for c in CLASSIC] and bare["cp_status"] == "no_mask_source"

    app = create_app(
        ServeConfig(
            bundle=str(naflex_bundle), metrics=CLASSIC, embedders={k: str(bundles[k]) for k in ("clip", "dino")}
        )
    )
    client = _ready_client(app)
    try:
        body = {
            **{k: base64.b64encode(v).decode() for k, v in files.items()},
            "prompt": want["prompt"],
            "object_name": want["object_name"],
        }
        got = client.post("/v1/score", json=body).json()
        batch = client.post("/v1/score_batch", json={"items": [body]}).json()["results"][0]
        doc = client.get("/openapi.json").json()["components"]["schemas"]
    finally:
        client.__exit__(None, None, None)
    for c in CLASSIC:
        assert repr(got[c]) == want[c] and got[f"{c}_status"] == "ok" and batch[c] == got[c]
        assert {"type": "number"} in doc["ScoreResult"]["properties"][c]["anyOf"]
    assert (repr(got["cp"]), repr(got["pf"])) == (want["cp"], want["pf"])
