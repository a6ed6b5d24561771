"""The Encoder base (runtime/encoder.py): runners made once under concurrent first use, released
by close(); the declared backend restriction; batching by shape; the runtime's LRU; and the
scorer's text store as a constructor argument, read-only after."""

from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass

import numpy as np
import pytest

from masc_engine.errors import BackendUnavailableError, BundleError
from masc_engine.runtime.encoder import LRU, Encoder, RunnerSettings, batches_by_shape

THREADS = 8


class FakeRunner:
    def __init__(self, graph: str):
        self.graph = graph
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


@dataclass(frozen=True)
class CountingSettings(RunnerSettings):
    """Runner settings whose factory makes :class:`FakeRunner` objects and records each creation.
    A creation waits (up to ``wait_s``) for ``THREADS`` creations to be under way at once: without
    the encoder's lock all threads get there and each makes a runner; with it only one does."""

    wait_s: float = 0.0

    def factory(self, bundle):
        made, lock = [], threading.Lock()
        inside = threading.Barrier(THREADS)

        def make(graph: str) -> FakeRunner:
            with lock:
                made.append(graph)
            if self.wait_s:
                try:
                    inside.wait(timeout=self.wait_s)
                except threading.BrokenBarrierError:
                    pass
            return FakeRunner(graph)

        make.made = made
        return make


def _encoder(bundle, **kw) -> Encoder:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # random-weight bundle
        return Encoder(bundle, CountingSettings(**kw), batch_size=2, verify=False)


def test_a_runner_is_made_once_under_concurrent_first_use(naflex_bundle):
    enc = _encoder(naflex_bundle, wait_s=1.0)
    start = threading.Barrier(THREADS)
    got: list = []
    errors: list = []

    def use() -> None:
        try:
            start.wait(timeout=30)
            got.append(enc.runner("vision"))
        except Exception as e:  # noqa: BLE001 - reported by the assert below
            errors.append(e)

    threads = [threading.Thread(target=use) for _ in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert enc._make_runner.made == ["vision"]
    assert len(got) == THREADS and all(r is got[0] for r in got)
    assert enc.runner("vision") is got[0] and enc._make_runner.made == ["vision"]


def test_close_releases_every_runner_once_and_refuses_after(naflex_bundle):
    with _encoder(naflex_bundle) as enc:
        runners = [enc.runner(g) for g in ("vision", "pool", "text")]
        assert [r.graph for r in runners] == ["vision", "pool", "text"]
        assert all(r.closed == 0 for r in runners)
    assert [r.closed for r in runners] == [1, 1, 1]
    enc.close()  # idempotent: nothing closed twice
    assert [r.closed for r in runners] == [1, 1, 1]
    with pytest.raises(RuntimeError, match="Encoder was closed"):
        enc.runner("vision")
    with pytest.raises(RuntimeError, match="closed"):
        enc.replace_runner("vision", FakeRunner("vision"))


def test_the_manifest_recipe_and_identity(naflex_bundle):
    from masc_engine.engine.bundle import Bundle

    enc = _encoder(naflex_bundle)
    m = Bundle(naflex_bundle, verify=False).manifest
    assert enc.image_settings.max_num_patches == m["image"]["max_num_patches"]
    assert enc.text_settings.max_length == m["text"]["max_length"]
    assert enc.tokenizer.encode(["a cat"])[0].input_ids.shape == (m["text"]["max_length"],)
    assert enc.identity() == {
        "fingerprint": enc.bundle.fingerprint,
        "backend": "onnxruntime",
        "provider": None,
        "precision": "fp32",
    }
    assert enc.describe()["bundle"] == str(naflex_bundle)


def test_a_bundle_of_another_kind_is_refused(seg_bundle):
    with pytest.raises(BundleError, match="is a segmenter bundle, not a scorer bundle"):
        _encoder(seg_bundle)

    from masc_engine.engine.bundle import Bundle

    with pytest.raises(BundleError, match="is a segmenter bundle, not a scorer bundle"):
        _encoder(Bundle(seg_bundle, verify=False, kind="segmenter"))


def test_the_declared_backends_are_enforced(naflex_bundle):
    class OrtOnly(Encoder):
        BACKENDS = ("onnxruntime",)
        BACKENDS_HINT = " (provider cpu)"

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        enc = OrtOnly(naflex_bundle, RunnerSettings(backend="openvino"), batch_size=1, verify=False)
    with pytest.raises(
        BackendUnavailableError,
        match=r"'openvino' does not run scorer bundles; use onnxruntime "
        r"\(provider cpu\)",
    ):
        enc.check_backend()
    ok = OrtOnly(enc.bundle, RunnerSettings(backend="onnxruntime", provider="cpu"), batch_size=1)
    ok.check_backend()  # ONNX Runtime on CPU is installed with the package
    anything = Encoder(enc.bundle, RunnerSettings(backend="no-such-backend"), batch_size=1)
    with pytest.raises(BackendUnavailableError, match="unknown backend 'no-such-backend'"):
        anything.check_backend()  # no declared restriction: the registry decides


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_batch_size_is_checked(naflex_bundle, bad):
    with pytest.raises(ValueError, match="batch_size must be an int >= 1"):
        Encoder(naflex_bundle, RunnerSettings(), batch_size=bad, verify=False)


def test_batches_by_shape():
    keys = [4, 9, 4, 4, 9, 1, 4]
    assert batches_by_shape(keys, 2) == [[0, 2], [3, 6], [1, 4], [5]]
    assert batches_by_shape(keys, 10) == [[0, 2, 3, 6], [1, 4], [5]]
    assert batches_by_shape([None] * 5, 2) == [[0, 1], [2, 3], [4]]
    assert batches_by_shape([], 3) == []


# --------------------------------------------------------------------------- LRU


def test_lru_evicts_the_least_recently_used():
    lru = LRU(3)
    for k in "abc":
        lru[k] = k.upper()
    assert lru.get("a") == "A"  # a lookup makes "a" the most recent
    assert "b" in lru  # a membership test does not
    lru["d"] = "D"
    assert sorted(lru) == ["a", "c", "d"]  # "b" was the least recently used
    assert lru["c"] == "C"
    lru["e"] = "E"
    assert sorted(lru) == ["c", "d", "e"]
    assert lru.get("b", "missing") == "missing"


def test_lru_by_size_and_a_value_larger_than_the_cache():
    lru = LRU(10, getsizeof=len)
    lru["a"] = b"12345"
    lru["b"] = b"1234"
    lru["c"] = b"12"  # 11 bytes: "a" goes
    assert sorted(lru) == ["b", "c"] and lru.currsize == 6
    lru["b"] = b"x" * 11  # larger than the whole cache: not kept, and its older value goes
    assert sorted(lru) == ["c"]
    none = LRU(0)
    none["a"] = 1
    assert len(none) == 0
    with pytest.raises(ValueError, match=">= 0"):
        LRU(-1)


def test_encoding_cache_memory_is_an_lru_of_items():
    from masc_engine.runtime.cache import EncodingCache
    from masc_engine.runtime.scorer import ImageEncoding

    cache = EncodingCache(scorer=None, items=2)
    encs = {d: ImageEncoding(np.full((1, 2), i, np.float32), (1, 1)) for i, d in enumerate("abc")}
    cache._lru_put("a", encs["a"])
    cache._lru_put("b", encs["b"])
    assert cache.cached("a") is encs["a"]  # "a" becomes the most recent
    cache._lru_put("c", encs["c"])
    assert cache.in_memory("a") and not cache.in_memory("b") and cache.in_memory("c")


# --------------------------------------------------------------------------- the segmenter's prompt LRU


def test_segmenter_prompt_lru_keeps_the_most_recent(seg_bundle):
    from masc_engine.runtime.segmenter import Segmenter

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        seg = Segmenter(seg_bundle, text_cache_size=2)
    first = seg.encode_prompts(["a cat", "a dog"])
    assert seg.texts_encoded == 2 and seg.text_cache_hits == 0
    seg.encode_prompts(["a cat"])  # a hit: "a cat" is now the most recent
    seg.encode_prompts(["a bird"])  # evicts "a dog"
    assert (seg.texts_encoded, seg.text_cache_hits) == (3, 1)
    again = seg.encode_prompts(["a cat", "a dog"])
    assert (seg.texts_encoded, seg.text_cache_hits) == (4, 2)  # "a cat" kept, "a dog" encoded again
    np.testing.assert_array_equal(again, first)
    seg.close()
    with pytest.raises(RuntimeError, match="Segmenter was closed"):
        seg.encode_prompts(["a fish"])


# --------------------------------------------------------------------------- the scorer's text store


class DictStore:
    def __init__(self):
        self.texts: dict[str, np.ndarray] = {}
        self.gets = 0

    def get_text(self, text):
        self.gets += 1
        return self.texts.get(text)

    def put_text(self, text, embedding):
        self.texts[text] = np.array(embedding, np.float32)


def _scorer(bundle, **kw):
    from masc_engine.runtime.scorer import Scorer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Scorer(bundle, **kw)


def test_the_scorer_text_store_is_given_and_read_only(naflex_bundle):
    store = DictStore()
    s = _scorer(naflex_bundle, text_store=store)
    assert s.text_store is store
    with pytest.raises(AttributeError):
        s.text_store = DictStore()
    emb, _ = s.encode_texts(["a red dog", "a cat"])
    assert sorted(store.texts) == ["a cat", "a red dog"]
    np.testing.assert_array_equal(store.texts["a red dog"], emb[0])
    plain = _scorer(naflex_bundle)
    assert plain.text_store is None
    np.testing.assert_array_equal(plain.encode_texts(["a red dog", "a cat"])[0], emb)
    again, _ = s.encode_texts(["a cat"])  # served from the store
    np.testing.assert_array_equal(again[0], emb[1])


def test_attach_text_store_once_then_detach(naflex_bundle):
    s = _scorer(naflex_bundle)
    store = DictStore()
    s.attach_text_store(store)
    assert s.text_store is store
    with pytest.raises(RuntimeError, match="text store already"):
        s.attach_text_store(DictStore())
    assert s.detach_text_store() is store and s.text_store is None
    assert s.detach_text_store() is None
    s.attach_text_store(store)  # a later run may attach its own
    assert s.text_store is store
