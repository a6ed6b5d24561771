"""The TensorRT backend's CPU-checkable parts: lazy import, refusal without TensorRT, profiles
(split / refuse), engine-compatibility checks, the fp32 precision policy, and the builder /
runner plumbing against a fake ``tensorrt`` (tests/fake_tensorrt.py).

What these tests cannot show: that real TensorRT accepts these calls, builds these graphs, or
meets the fidelity gates. No TensorRT or GPU was available where they were written; the README's
support matrix lists the TensorRT path as unverified.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

import fake_tensorrt
from conftest import REPO
from masc_engine.engine.backends import trt_profiles as tp
from masc_engine.engine.bundle import Bundle
from masc_engine.errors import BackendUnavailableError, BundleError, EngineCompatibilityError, InputError, ProfileError

INFO = {"tensorrt_version": "11.4.0.106", "gpu_name": "NVIDIA H200", "compute_capability": "9.0"}


@pytest.fixture
def no_tensorrt(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # import tensorrt -> ImportError


@pytest.fixture
def fake_trt(monkeypatch, tmp_path):
    """A fake tensorrt module, a numpy 'device', this machine posing as an H200."""
    from masc_engine.engine.backends import tensorrt as trt_backend

    monkeypatch.setitem(sys.modules, "tensorrt", fake_tensorrt.make_module(INFO["tensorrt_version"]))
    monkeypatch.setattr(trt_backend, "CupyDevice", fake_tensorrt.NumpyDevice)
    monkeypatch.setattr(trt_backend, "_query_gpu", lambda device: (INFO["gpu_name"], INFO["compute_capability"]))
    monkeypatch.setenv("MASC_ENGINE_CACHE", str(tmp_path / "cache"))
    fake_tensorrt.BUILDS.clear()
    fake_tensorrt.RUNS.clear()
    return trt_backend


@pytest.fixture
def bundle_copy(naflex_bundle, tmp_path):
    dst = tmp_path / "bundle"
    shutil.copytree(naflex_bundle, dst)
    return dst


@pytest.fixture
def fp16_copy(fp16_bundle, tmp_path):
    dst = tmp_path / "bundle16"
    shutil.copytree(fp16_bundle, dst)
    return dst


# ------------------------------------------------------------------ without TensorRT


def test_importing_masc_engine_does_not_need_tensorrt():
    code = ("import sys; sys.modules['tensorrt'] = None; import masc_engine, masc_engine.engine.bundle, "
            "masc_engine.engine.backends.tensorrt, masc_engine.cli.export_cmd; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_tensorrt_backend_without_tensorrt_names_what_to_install(naflex_bundle, no_tensorrt):
    with pytest.raises(BackendUnavailableError, match="pip install tensorrt"):
        Bundle(naflex_bundle).runner("vision", backend="tensorrt", provider="cuda", precision="fp16")


def test_onnxruntime_refuses_reduced_precision(naflex_bundle):
    with pytest.raises(BackendUnavailableError, match="fp32"):
        Bundle(naflex_bundle).runner("cp", precision="fp16")


def test_export_cli_fails_fast_without_tensorrt(tmp_path, no_tensorrt):
    from masc_engine.cli.export_cmd import main

    out = tmp_path / "b"
    res = CliRunner().invoke(main, ["--model", "random:tiny-naflex", "--out", str(out), "--backend", "tensorrt",
                                    "--precision", "fp16"])
    assert res.exit_code != 0 and "pip install tensorrt" in res.output
    assert not out.exists()  # refused before exporting anything
    res = CliRunner().invoke(main, ["--out", str(out), "--engines-only"])
    assert res.exit_code == 2 and "--backend tensorrt" in res.output


# ------------------------------------------------------------------ profiles


def test_profiles_cover_the_budget(naflex_bundle):
    m = json.loads((naflex_bundle / "manifest.json").read_text())
    ranges = tp.default_axis_ranges(m, max_batch=8, max_outs_per_ref=32)
    v = tp.profile_shapes(m["graphs"]["vision"], ranges)
    assert v["pixel_values"] == {"min": [1, 1, 768], "opt": [4, 1024, 768], "max": [8, 1024, 768]}
    assert v["position_weights"]["max"] == [8, 1024, 256]
    assert tp.profile_shapes(m["graphs"]["text"], ranges)["input_ids"]["max"] == [8, 64]
    cp = tp.profile_shapes(m["graphs"]["cp"], ranges)
    assert cp["out_tokens"] == {"min": [1, 1, 1, 64], "opt": [4, 16, 1024, 64], "max": [8, 32, 1024, 64]}
    assert cp["ref_keep"]["max"] == [8, 1024]


def test_plan_batches_splits_and_refuses(naflex_bundle):
    m = json.loads((naflex_bundle / "manifest.json").read_text())
    entry = m["graphs"]["vision"]
    prof = tp.profile_shapes(entry, tp.default_axis_ranges(m, max_batch=16))
    shapes = lambda b, n: {"pixel_values": (b, n, 768), "pixel_attention_mask": (b, n),  # noqa: E731
                           "position_weights": (b, n, 256)}
    assert tp.plan_batches("vision", entry, shapes(5, 300), prof) == [slice(0, 5)]
    assert tp.plan_batches("vision", entry, shapes(37, 1024), prof) == [slice(0, 16), slice(16, 32), slice(32, 37)]
    assert tp.plan_batches("vision", entry, shapes(0, 10), prof) == []
    with pytest.raises(ProfileError, match=r"'num_patches' is 1500, outside .* allowed range \[1, 1024\]") as e:
        tp.plan_batches("vision", entry, shapes(2, 1500), prof)
    assert isinstance(e.value, InputError) and e.value.reason == "outside_engine_profile"
    with pytest.raises(ProfileError, match="disagree on the batch size"):
        tp.plan_batches("vision", entry, {**shapes(2, 10), "position_weights": (3, 10, 256)}, prof)
    with pytest.raises(ProfileError, match=r"axis 2 is 700, outside .* \[768, 768\]"):
        tp.plan_batches("vision", entry, {**shapes(2, 10), "pixel_values": (2, 10, 700)}, prof)
    cp = m["graphs"]["cp"]
    cprof = tp.profile_shapes(cp, tp.default_axis_ranges(m, max_batch=4, max_outs_per_ref=8))
    cshapes = {"ref_tokens": (9, 30, 64), "ref_keep": (9, 30), "out_tokens": (9, 8, 40, 64), "out_valid": (9, 8, 40)}
    assert tp.plan_batches("cp", cp, cshapes, cprof) == [slice(0, 4), slice(4, 8), slice(8, 9)]
    with pytest.raises(ProfileError, match="'outs_per_ref' is 9.*--max-outs-per-ref"):
        tp.plan_batches("cp", cp, {**cshapes, "out_tokens": (9, 9, 40, 64), "out_valid": (9, 9, 40)}, cprof)


# ------------------------------------------------------------------ compatibility


def test_check_compatible_names_both_sides_and_the_rebuild_command(tmp_path):
    tp.check_compatible(INFO, dict(INFO), tmp_path, "fp16")
    for key, other in [("tensorrt_version", "10.3.0"), ("gpu_name", "NVIDIA A100-SXM4-80GB"),
                       ("compute_capability", "8.0")]:
        with pytest.raises(EngineCompatibilityError) as e:
            tp.check_compatible(INFO, {**INFO, key: other}, tmp_path, "fp16")
        msg = str(e.value)
        assert repr(INFO[key]) in msg and repr(other) in msg
        assert f"masc-export --out {tmp_path} --backend tensorrt --precision fp16 --engines-only" in msg


# ------------------------------------------------------------------ plumbing against a fake TensorRT


def test_build_load_and_run_with_a_fake_tensorrt(fake_trt, fp16_copy):
    from masc_engine.cli.export_cmd import main
    from masc_engine.runtime.cp_device import GraphCP
    from masc_engine.export.validate import cp_validation_cases

    bundle_copy = fp16_copy
    # Strongly typed: the engines' precision is the graphs'; fp32 engines from fp16 graphs are refused.
    res = CliRunner().invoke(main, ["--out", str(bundle_copy), "--backend", "tensorrt", "--precision", "fp32",
                                    "--engines-only"])
    assert res.exit_code != 0 and "holds fp16 graphs" in res.output and "--precision fp32" in res.output
    res = CliRunner().invoke(main, ["--out", str(bundle_copy), "--backend", "tensorrt",
                                    "--engines-only", "--max-batch", "2", "--max-outs-per-ref", "4"])
    assert res.exit_code == 0, res.output
    side = json.loads((bundle_copy / "tensorrt-fp16" / "engines.json").read_text())
    assert {k: side[k] for k in INFO} == INFO and side["precision"] == "fp16"
    assert set(side["engines"]) == {"vision", "pool", "text", "cp"}
    assert side["engines"]["vision"]["profiles"][0]["pixel_values"]["max"] == [2, 1024, 768]
    manifest = json.loads((bundle_copy / "manifest.json").read_text())
    assert side["precision_policy"] == manifest["precision"]["policy"] and side["precision_policy"]["version"] >= 1
    builds = {b["onnx"].rsplit("/", 1)[-1]: b for b in fake_tensorrt.BUILDS}
    for b in builds.values():  # strongly typed networks; TF32 cleared; no weak-typing flag exists to set
        assert b["strongly_typed"] and b["flags"] == set()
    assert "FLOAT16" in builds["vision.onnx"]["initializer_dtypes"]
    # One timing cache, reused: each build found the previous builds' entries.
    assert [b["cache_builds"] for b in fake_tensorrt.BUILDS] == [1, 2, 3, 4]
    assert (bundle_copy.parent / "cache" / "tensorrt").is_dir()

    b = Bundle(bundle_copy)
    cp_trt = b.runner("cp", backend="tensorrt", provider="cuda")  # the only engine set: fp16
    assert cp_trt.precision == "fp16"  # resolved when none is named (masc-run keys its cache by it)
    cp_ort = b.runner("cp")
    case = cp_validation_cases(64)[1]  # 3 references: split into runs of max_batch = 2
    fake_tensorrt.RUNS.clear()
    got, want = cp_trt.run(case["feeds"]), cp_ort.run(case["feeds"])
    assert [r["ref_tokens"][0] for r in fake_tensorrt.RUNS] == [2, 1]
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
    # The CP packer keeps within outs_per_ref when told the engine's limit.
    feeds_cp = GraphCP(cp_trt, max_outs_per_ref=4, max_refs_per_call=2)
    rng = np.random.default_rng(0)
    ref = rng.normal(size=(20, 64)).astype(np.float32)
    w = rng.random(20).astype(np.float32)
    outs = [rng.normal(size=(m, 64)).astype(np.float32) for m in (5, 9, 12, 3, 7, 20)]
    assert np.allclose([c for c, _ in feeds_cp.score(ref, w, outs)], [c for c, _ in GraphCP(cp_ort).score(ref, w, outs)])

    # Refusals, in order of the checks.
    with pytest.raises(BackendUnavailableError, match="CUDA GPUs only"):
        b.runner("cp", backend="tensorrt", provider="cpu")
    with pytest.raises(BundleError, match="no TensorRT bf16 engines.*--precision bf16 --engines-only"):
        b.runner("cp", backend="tensorrt", provider="cuda", precision="bf16")
    with pytest.raises(ProfileError, match=r"\[1, 1024\]"):
        b.runner("pool", backend="tensorrt", provider="cuda").run(
            {"hidden": np.zeros((1, 1025, 64), np.float32), "key_padding_mask": np.zeros((1, 1025), bool)})
    side_path = bundle_copy / "tensorrt-fp16" / "engines.json"
    moved = {**side, "gpu_name": "NVIDIA A100-SXM4-80GB", "compute_capability": "8.0"}
    side_path.write_text(json.dumps(moved))
    with pytest.raises(EngineCompatibilityError, match="A100.*H200.*--engines-only"):
        b.runner("cp", backend="tensorrt", provider="cuda", precision="fp16")
    stale = {**side, "engines": {**side["engines"], "cp": {**side["engines"]["cp"], "onnx_sha256": "0" * 64}}}
    side_path.write_text(json.dumps(stale))
    with pytest.raises(EngineCompatibilityError, match="another cp.onnx"):
        b.runner("cp", backend="tensorrt", provider="cuda", precision="fp16")
    side_path.write_text(json.dumps(side))
    (bundle_copy / "tensorrt-fp16" / "cp.engine").write_bytes(b"tampered")
    with pytest.raises(BundleError, match="missing or modified"):
        b.runner("cp", backend="tensorrt", provider="cuda", precision="fp16")


def test_fp32_engines_clear_tf32_and_take_fp32_graphs(fake_trt, bundle_copy):
    fake_trt.build_engines(bundle_copy, graphs=["pool"], log=lambda s: None)  # the bundle's precision: fp32
    (build,) = fake_tensorrt.BUILDS
    assert build["strongly_typed"] and build["flags"] == set()  # TF32 cleared
    assert "FLOAT" in build["initializer_dtypes"] and "FLOAT16" not in build["initializer_dtypes"]
    assert json.loads((bundle_copy / "tensorrt-fp32" / "engines.json").read_text())["precision"] == "fp32"
    with pytest.raises(BundleError, match="holds fp32 graphs.*--precision bf16"):
        fake_trt.build_engines(bundle_copy, precision="bf16", log=lambda s: None)
    # A bf16 bundle on a GPU without bf16 (the manifest's mode is what build_engines reads).
    m = json.loads((bundle_copy / "manifest.json").read_text())
    m["precision"] = {"mode": "bf16"}
    (bundle_copy / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(BackendUnavailableError, match="bf16 needs compute capability"):
        from masc_engine.engine.backends import tensorrt as trt_backend

        trt_backend._query_gpu = lambda device: ("Tesla T4", "7.5")  # restored by monkeypatch
        fake_trt.build_engines(bundle_copy, log=lambda s: None)


@pytest.mark.parametrize("n_outs", [32, 100])
def test_cp_scores_any_outputs_per_reference_through_trt_and_ort(fake_trt, bundle_copy, n_outs):
    """One reference against 32 / 100 outputs (the DreamBench shape is 32): GraphCP packs within the
    engine profile's outs_per_ref range (16 by default), and CP equals the ORT cp graph's."""
    from masc_engine.runtime.cp_device import GraphCP
    from masc_engine.runtime.heads import masked_maxcos
    from masc_engine.tolerances import CP_HEAD_ATOL

    fake_trt.build_engines(bundle_copy, graphs=["cp"], log=lambda s: None)  # masc-export's defaults
    b = Bundle(bundle_copy)
    cp_trt, cp_ort = b.runner("cp", backend="tensorrt", provider="cuda"), b.runner("cp")
    assert cp_trt.axis_limit("outs_per_ref") == 16
    rng = np.random.default_rng(n_outs)
    base = rng.normal(size=64)
    ref = (rng.normal(size=(40, 64)) + base).astype(np.float32)
    w = rng.random(40).astype(np.float32)
    outs = [(rng.normal(size=(int(m), 64)) + base).astype(np.float32) for m in rng.integers(5, 60, n_outs)]
    fake_tensorrt.RUNS.clear()
    got = [c for c, _ in GraphCP(cp_trt).score(ref, w, outs)]
    assert fake_tensorrt.RUNS and max(r["out_tokens"][1] for r in fake_tensorrt.RUNS) <= 16
    want = [c for c, _ in GraphCP(cp_ort).score(ref, w, outs)]
    numpy_head = [masked_maxcos(ref, o, w, 0.5)[0] for o in outs]
    assert len(got) == n_outs
    np.testing.assert_allclose(got, want, rtol=0, atol=CP_HEAD_ATOL)
    np.testing.assert_allclose(got, numpy_head, rtol=0, atol=CP_HEAD_ATOL)
    feeds = {"ref_tokens": ref[None], "ref_keep": (w > 0.5)[None], "out_tokens": np.zeros((1, 17, 8, 64), np.float32),
             "out_valid": np.ones((1, 17, 8), bool)}
    with pytest.raises(ProfileError, match=r"'outs_per_ref' is 17.*\[1, 16\].*--max-outs-per-ref"):
        cp_trt.run(feeds)


# ------------------------------------------------------------------ issue 13: checked calls, order, threads


@pytest.fixture
def trt_engines(fake_trt, bundle_copy):
    fake_trt.build_engines(bundle_copy, log=lambda s: None)
    fake_tensorrt.FAIL.clear()
    fake_tensorrt.CALLS.clear()
    yield Bundle(bundle_copy)
    fake_tensorrt.FAIL.clear()


def _pool_feeds(b=2, n=30):
    rng = np.random.default_rng(0)
    return {"hidden": rng.normal(size=(b, n, 64)).astype(np.float32), "key_padding_mask": rng.random((b, n)) < 0.3}


@pytest.mark.parametrize("call,match", [
    ("set_input_shape", r"set_input_shape\('hidden', \(2, 30, 64\)\) failed"),
    ("set_tensor_address", r"set_tensor_address\('hidden'\) failed for shape \(2, 30, 64\)"),
    ("execute_async_v3", r"execution of 'pool' failed"),
    ("data_dependent", r"output 'pooled' has shape \(-1, -1\).*data-dependent"),
])
def test_trt_failures_reported_by_return_value_raise_typed_errors(trt_engines, call, match):
    from masc_engine.engine.backends.tensorrt import TensorRTCallError

    runner = trt_engines.runner("pool", backend="tensorrt", provider="cuda")
    fake_tensorrt.FAIL.add(call)
    with pytest.raises(TensorRTCallError, match=match):
        runner.run(_pool_feeds())


def test_trt_device_inputs_are_dtype_checked(trt_engines):
    runner = trt_engines.runner("pool", backend="tensorrt", provider="cuda")
    dev = fake_tensorrt.NumpyDevice()
    feeds = _pool_feeds()
    with pytest.raises(TypeError, match="input hidden must be float32, got float64"):
        runner.run_device({**feeds, "hidden": dev.from_host(feeds["hidden"].astype(np.float64))}, dev)


def test_trt_run_device_allocates_outputs_before_synchronizing(trt_engines):
    """As OrtRunner.run_device: outputs are allocated, then the device is synchronised, then bound."""
    runner = trt_engines.runner("pool", backend="tensorrt", provider="cuda")
    dev = fake_tensorrt.NumpyDevice()
    feeds = {k: dev.from_host(v) for k, v in _pool_feeds().items()}
    fake_tensorrt.CALLS.clear()
    out = runner.run_device(feeds, dev)
    names = [c for c, _ in fake_tensorrt.CALLS]
    last_empty = max(i for i, c in enumerate(names) if c == "empty")
    sync = names.index("synchronize", last_empty)
    first_bind = names.index("set_tensor_address")
    assert last_empty < sync < first_bind < names.index("execute_async_v3")
    assert [x for x in fake_tensorrt.CALLS if x[0] == "empty"] == [("empty", (2, 64)), ("empty", (2, 30))]
    np.testing.assert_array_equal(dev.to_host(out["pooled"]), trt_engines.runner("pool").run(_pool_feeds())["pooled"])


def test_one_trt_scorer_serves_several_threads_on_the_device_path(trt_engines):
    """Four threads share one device-resident TensorRT scorer (fake engines, numpy 'device'): each
    gets the scores a sequential run gives."""
    from concurrent.futures import ThreadPoolExecutor

    from conftest import blob_mask
    from masc_engine.export.validate import synthetic_image
    from masc_engine.runtime.scorer import Pair, Scorer

    sizes = [(224, 288), (160, 480), (333, 217), (256, 256), (97, 203), (300, 301), (181, 377), (200, 150)]
    pairs = [Pair(synthetic_image(h, w, i), blob_mask(h, w, i), synthetic_image(w, h, i + 50),
                  blob_mask(w, h, i + 50, frac=0.2), ["a dog on the beach", "a red cat"][i % 2], ["dog", "cat"][i % 2])
             for i, (h, w) in enumerate(sizes)]
    scorer = Scorer(trt_engines, backend="tensorrt", provider="cuda", device_resident=True,
                    array_device=fake_tensorrt.NumpyDevice(), batch_size=2)
    want = [(r.cp, r.pf) for r in Scorer(trt_engines, cp_head="graph").score_batch(pairs)]
    chunks = [pairs[i::4] for i in range(4)]
    with ThreadPoolExecutor(4) as ex:
        got = list(ex.map(lambda ps: [(r.cp, r.pf) for r in scorer.score_batch(ps)] , chunks * 2))
    for j, res in enumerate(got):
        idx = list(range(len(pairs)))[j % 4::4]
        np.testing.assert_allclose(res, [want[i] for i in idx], rtol=0, atol=1e-6)


def test_ort_cuda_provider_gets_tf32_off(monkeypatch, naflex_bundle):
    """fp32 on ONNX Runtime's CUDA provider is fp32: ``use_tf32`` = 0 in the provider options."""
    import onnxruntime as ort

    from masc_engine.engine.backends.onnxruntime import OrtRunner

    calls = []
    real = ort.InferenceSession

    class Spy:
        def __init__(self, path, sess_options=None, providers=None):
            calls.append(providers)
            self._s = real(path, sess_options=sess_options, providers=["CPUExecutionProvider"])

        def get_providers(self):
            return [calls[-1][0][0]]

        def __getattr__(self, k):
            return getattr(self._s, k)

    preloads = []
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    monkeypatch.setattr(ort, "InferenceSession", Spy)
    monkeypatch.setattr(ort, "preload_dlls", lambda *a, **k: preloads.append(1), raising=False)
    OrtRunner(str(naflex_bundle / "cp.onnx"), "cp", provider="cuda")
    OrtRunner(str(naflex_bundle / "cp.onnx"), "cp", provider="cpu")
    assert calls == [[("CUDAExecutionProvider", {"use_tf32": "0"})], [("CPUExecutionProvider", {})]]
    assert preloads == [1]  # CUDA/cuDNN from the NVIDIA wheels, for the CUDA provider only
