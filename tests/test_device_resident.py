"""The device-resident pipeline (engine/device.py, OrtRunner.run_device, Scorer(device_resident=True)).

On a GPU the tokens would be CuPy arrays; here the same code runs on ONNX Runtime's CPU provider
through IO binding, with host numpy memory (HostDevice) and with a strict fake device whose arrays,
like CuPy's, refuse implicit conversion to numpy and log every copy back to the host. What these
tests show: the device-resident path gives the same scores as the host path; no token array is
ever copied back; no step silently converts a device array on the host. What they cannot show:
that CUDA IO binding and CuPy behave as documented on a real GPU (unverified on a GPU: docs/verification.md).
"""

from __future__ import annotations

import numpy as np
import pytest

from support import EXAMPLES, load_pair, read_rows, with_baselines
from doubles.device import StrictFakeDevice
from masc_engine.engine.bundle import Bundle
from masc_engine.engine.device import HostDevice, device_for
from masc_engine.errors import BackendUnavailableError
from masc_engine.runtime.scorer import Pair, Scorer
from masc_engine.tolerances import CP_HEAD_ATOL


def example_pairs(n: int | None = None) -> list[Pair]:
    rows = read_rows(EXAMPLES)[:n]
    cache: dict = {}
    pairs = []
    for r in rows:
        ref_im, ref_m, out_im, out_m, prompt, name = load_pair(EXAMPLES, r)
        # one image object per file, as masc-run shares encodings: a reference scored many times
        ref_im = cache.setdefault(r["ref_image"], ref_im)
        out_im = cache.setdefault(r["out_image"], out_im)
        pairs.append(Pair(ref_im, ref_m, out_im, out_m, prompt, name))
    return pairs


def test_strict_fake_device_is_strict():
    a = StrictFakeDevice().zeros((2, 3))
    with pytest.raises(TypeError):
        np.asarray(a)
    with pytest.raises(TypeError):
        a[0] = np.ones(3, np.float32)


@pytest.mark.parametrize("device_cls", [HostDevice, StrictFakeDevice])
def test_run_device_equals_run_on_every_graph(naflex_bundle, device_cls):
    """IO binding by pointer gives bit-identical outputs to session.run, for each graph, on shapes
    other than the traced ones."""
    b = Bundle(naflex_bundle)
    dev = device_cls()
    rng = np.random.default_rng(0)
    d = b.manifest["architecture"]["vision_width"]
    feeds_by_graph = {
        "pool": {"hidden": rng.standard_normal((3, 11, d), np.float32), "key_padding_mask": rng.random((3, 11)) < 0.4},
        "cp": {
            "ref_tokens": rng.standard_normal((2, 7, d), np.float32),
            "ref_keep": rng.random((2, 7)) < 0.6,
            "out_tokens": rng.standard_normal((2, 3, 9, d), np.float32),
            "out_valid": rng.random((2, 3, 9)) < 0.8,
        },
        "text": {"input_ids": rng.integers(0, 300, (2, 64), dtype=np.int64)},
    }
    for graph, feeds in feeds_by_graph.items():
        r = b.runner(graph)
        want = r.run(feeds)
        dev_feeds = {k: (dev.from_host(v) if v.dtype == np.float32 else v) for k, v in feeds.items()}
        got = r.run_device(dev_feeds, dev)
        assert set(got) == set(want)
        for k in want:
            assert dev.is_device_array(got[k])
            np.testing.assert_array_equal(dev.to_host(got[k]), want[k], err_msg=f"{graph}.{k}")


def test_run_device_refuses_mismatches(naflex_bundle):
    b = Bundle(naflex_bundle)
    pool = b.runner("pool")
    d = b.manifest["architecture"]["vision_width"]

    class CudaMemory(HostDevice):
        name, ort_device_type = "cuda:0", "cuda"

    feeds = {"hidden": np.zeros((1, 4, d), np.float32), "key_padding_mask": np.zeros((1, 4), bool)}
    with pytest.raises(BackendUnavailableError, match="CPUExecutionProvider.*cuda:0"):
        pool.run_device(feeds, CudaMemory())
    with pytest.raises(ValueError, match="num_tokens"):
        pool.run_device(
            {"hidden": np.zeros((1, 4, d), np.float32), "key_padding_mask": np.zeros((1, 5), bool)}, HostDevice()
        )
    with pytest.raises(TypeError, match="float32"):
        pool.run_device(
            {"hidden": np.zeros((1, 4, d), np.float64), "key_padding_mask": np.zeros((1, 4), bool)}, HostDevice()
        )


def test_device_resident_scores_equal_host_path(naflex_bundle):
    pairs = example_pairs()
    host = Scorer(naflex_bundle, cp_head="graph").score_batch(pairs)
    numpy_head = Scorer(naflex_bundle).score_batch(pairs)
    dev = Scorer(naflex_bundle, device_resident=True).score_batch(pairs)
    assert isinstance(Scorer(naflex_bundle, device_resident=True).device, HostDevice)
    for h, n, r in zip(host, numpy_head, dev, strict=True):
        assert r.cp == h.cp and r.pf == h.pf  # same graphs, same inputs: bit-identical
        assert abs(r.cp - n.cp) <= CP_HEAD_ATOL and r.pf == n.pf
        assert r.extras == h.extras


def test_tokens_never_leave_the_device(naflex_bundle):
    """Only scores-sized arrays come back: cp [R, K] and pooled/attention rows, never a token
    array; and no pipeline step converts a device array implicitly (the fake raises like CuPy)."""
    dev = StrictFakeDevice()
    pairs = example_pairs()
    s = Scorer(naflex_bundle, device_resident=True, array_device=dev, batch_size=4)
    got = s.score_batch(pairs)
    want = Scorer(naflex_bundle, cp_head="graph", batch_size=4).score_batch(pairs)
    for g, w in zip(got, want, strict=True):
        assert (g.cp, g.pf) == (w.cp, w.pf)
    d = s.bundle.manifest["architecture"]["vision_width"]
    assert dev.to_host_log, "scores must come back through to_host"
    for shape in dev.to_host_log:
        # pooled [B, D], attention [B, N], cp [R, K]: 2-D; a token array would be [.., N, D]
        assert len(shape) <= 2, f"a token-shaped array {shape} was copied to the host"
    assert not dev.from_host_log, "tokens were copied host-to-device: they should be born on the device"
    # the cp graph is fed device tokens: no [R, K, N] best array is fetched without maps
    assert all(shape[-1] != d or len(shape) == 2 for shape in dev.to_host_log)


def test_device_encodings_own_their_memory(naflex_bundle):
    """A cached encoding must not keep its whole batch output alive: each image's tokens are
    copied out of the [B, n, D] vision output on the device."""
    dev = StrictFakeDevice()
    s = Scorer(naflex_bundle, device_resident=True, array_device=dev, batch_size=4)
    pairs = example_pairs(4)
    encs = s.encode_images([p.out_image for p in pairs])
    for e in encs:
        a = e.tokens.a
        assert a.base is None and a.flags.owndata and a.shape == (e.grid[0] * e.grid[1], a.shape[1])


def test_device_resident_maps_and_baselines_copy_only_when_asked(naflex_bundle):
    from masc_engine.runtime.scorer import EncodedPair

    dev = StrictFakeDevice()
    s = Scorer(naflex_bundle, device_resident=True, array_device=dev)
    h = Scorer(naflex_bundle, cp_head="graph")
    pairs = example_pairs(4)

    def encoded(scorer):
        items = []
        for p in pairs:
            r, o = scorer.encode_images([p.ref_image, p.out_image])
            items.append(
                EncodedPair(
                    r,
                    scorer.mask_weights(p.ref_image, p.ref_mask, r.grid, "reference"),
                    o,
                    scorer.mask_weights(p.out_image, p.out_mask, o.grid, "output"),
                    p.prompt,
                    p.object_name,
                )
            )
        return items

    got = with_baselines(s, encoded(s), with_arrays=True)
    want = with_baselines(h, encoded(h), with_arrays=True)
    for g, w in zip(got, want, strict=True):
        for k, v in w.extras.items():
            assert g.extras[k] == v or (np.isnan(v) and np.isnan(g.extras[k])), k
        np.testing.assert_array_equal(g.arrays["cp_best"], w.arrays["cp_best"])
        np.testing.assert_array_equal(g.arrays["pf_attention"], w.arrays["pf_attention"])
    assert any(
        len(shape) == 2 and shape[1] == s.bundle.manifest["architecture"]["vision_width"] and shape[0] > 8
        for shape in dev.to_host_log
    ), "maps need the tokens: they are copied then"


def test_device_resident_needs_graph_head(naflex_bundle):
    with pytest.raises(ValueError, match="cp_head='graph'"):
        Scorer(naflex_bundle, device_resident=True, cp_head="numpy")


def test_gpu_device_without_cupy_or_gpu_is_an_error():
    """No quiet switch to host memory when a GPU device cannot be had."""
    try:
        import cupy

        cupy.cuda.runtime.getDeviceCount()
        pytest.skip("a CUDA GPU with CuPy is present")
    except Exception:  # noqa: BLE001  (no CuPy, or CuPy without a GPU)
        pass
    with pytest.raises(BackendUnavailableError, match="CuPy|CUDA"):
        device_for("onnxruntime", "cuda")
    assert isinstance(device_for("onnxruntime", "cpu"), HostDevice)


def test_masc_run_device_resident_with_cache_equals_host(naflex_bundle, tmp_path):
    """masc-run's encoding LRU and persistent cache hold device tokens (copied to the host only
    for the on-disk store); a device-resident run, cold and warm, scores as the host run."""
    import csv

    from masc_engine.jobs.pairs import RunOptions, RunSettings, run_pairs
    from masc_engine.jobs.results import read_output

    rows = read_rows(EXAMPLES)
    csv_path = tmp_path / "pairs.csv"
    with open(csv_path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        for r in rows:
            w.writerow(
                {
                    k: (str(EXAMPLES / v) if k in ("ref_image", "ref_mask", "out_image", "out_mask") else v)
                    for k, v in r.items()
                }
            )
    host_out = tmp_path / "host.csv"
    run_pairs(
        csv_path, Scorer(naflex_bundle, cp_head="graph"), host_out, RunSettings(), options=RunOptions(progress=False)
    )
    want = read_output(host_out)
    for run in ("cold", "warm"):
        dev = StrictFakeDevice()
        out = tmp_path / f"dev-{run}.csv"
        summary = run_pairs(
            csv_path,
            Scorer(naflex_bundle, device_resident=True, array_device=dev),
            out,
            RunSettings(),
            options=RunOptions(cache_dir=tmp_path / "cache", progress=False),
        )
        got = read_output(out)
        assert [(r["cp"], r["pf"], r["status"]) for r in got] == [(r["cp"], r["pf"], r["status"]) for r in want]
        if run == "warm":
            assert summary.images_encoded == 0 and summary.cache_hits > 0
            assert dev.from_host_log, "cached tokens are moved to the device"


# ------------------------------------------------------------------ streams, pinned buffers, the overlapped loop


def test_host_device_streams_pinned_memory_and_copies():
    from masc_engine.engine.device import PinnedStaging

    dev = HostDevice()
    stream = dev.new_stream()
    assert stream.ptr == 0
    host = dev.pinned_empty((3, 4), np.float32)
    host[...] = np.arange(12, dtype=np.float32).reshape(3, 4)
    dst = dev.empty((3, 4), np.float32)
    dev.copy_to_device(host, dst, stream)
    back = np.zeros((3, 4), np.float32)
    dev.copy_to_host(dst, back, stream)
    stream.synchronize()
    np.testing.assert_array_equal(back, host)
    free, total = dev.mem_get_info()
    assert 0 < free <= total
    staging = PinnedStaging(dev)
    a = staging.stage("x", np.ones((2, 5), np.float32))
    staging.next_call()
    b = staging.stage("x", np.zeros((4,), np.int64))  # the other slot: a is not overwritten
    assert a.sum() == 10 and b.dtype == np.int64 and b.shape == (4,)
    staging.next_call()
    c = staging.stage("x", np.full((3,), 7, np.float32))  # back to the first slot's buffer, reused
    assert np.shares_memory(a, c) and c.tolist() == [7, 7, 7]


def test_overlapped_keeps_order_and_raises():
    import threading

    from masc_engine.engine.device import overlapped

    seen = []
    out = overlapped(range(5), lambda i: (seen.append(threading.current_thread().name), i * i)[1], lambda x: x + 1)
    assert out == [1, 2, 5, 10, 17]
    assert all(name.startswith("prepare") for name in seen)  # host work off the caller's thread
    assert overlapped([], lambda i: i, lambda x: x) == []

    def bad(i):
        if i == 2:
            raise ValueError("image 2 is not decodable")
        return i

    with pytest.raises(ValueError, match="image 2"):
        overlapped(range(4), bad, lambda x: x)
