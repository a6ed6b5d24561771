"""The TensorRT backend's CPU-checkable parts: lazy import, refusal without TensorRT, profiles
(split / refuse), engine-compatibility checks, the fp32 precision policy, the device-memory plan,
and the builder / runner plumbing against a fake ``tensorrt`` (tests/doubles/fake_tensorrt.py) that is
asynchronous, runs out of memory, rejects unsupported ops and bad profiles as the real one does.

Each unkindness has a test the code would fail without its guard, and the guard is shown to
matter: a copy of the backend module holding the guard (engine/backends/tensorrt.py, trt_build.py,
trt_device.py) with the guard removed (:func:`mutant`) fails that
test (no synchronize before reading outputs, no None check on the execution context, no check of
``add_optimization_profile``, no typed error for a refused profile, a static context, a stream
object for the handle).

What these tests cannot show: that real TensorRT accepts these calls, builds these graphs, or
meets the fidelity gates: docs/gpu.md and docs/verification.md list the TensorRT path as
unverified on a GPU.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import types

import numpy as np
import pytest
from click.testing import CliRunner

from doubles import fake_tensorrt
from support import REPO
from masc_engine.engine.backends import trt_profiles as tp
from masc_engine.engine.bundle import Bundle
from masc_engine.errors import (
    BackendUnavailableError,
    BundleError,
    DeviceMemoryError,
    EngineCompatibilityError,
    InputError,
    ProfileError,
)
from masc_engine.tolerances import BATCH_INVARIANCE_ATOL

INFO = {"tensorrt_version": "11.4.0.106", "gpu_name": "NVIDIA H200", "compute_capability": "9.0"}


@pytest.fixture
def no_tensorrt(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # import tensorrt -> ImportError


@pytest.fixture
def fake_trt(monkeypatch, tmp_path):
    """A fake tensorrt module, a numpy 'device', this machine posing as an H200 (each name patched
    in the module that looks it up: ``CupyDevice`` in the runner's module and in trt_device.py,
    ``_query_gpu`` in trt_device.py)."""
    from masc_engine.engine.backends import tensorrt as trt_backend
    from masc_engine.engine.backends import trt_device

    monkeypatch.setitem(sys.modules, "tensorrt", fake_tensorrt.make_module(INFO["tensorrt_version"]))
    monkeypatch.setattr(trt_backend, "CupyDevice", fake_tensorrt.NumpyDevice)
    monkeypatch.setattr(trt_device, "CupyDevice", fake_tensorrt.NumpyDevice)
    monkeypatch.setattr(trt_device, "_query_gpu", lambda device: (INFO["gpu_name"], INFO["compute_capability"]))
    monkeypatch.setenv("MASC_ENGINE_CACHE", str(tmp_path / "cache"))
    fake_tensorrt.reset()
    yield trt_backend
    fake_tensorrt.reset()


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


@pytest.mark.slow
def test_importing_masc_engine_does_not_need_tensorrt():
    code = (
        "import sys; sys.modules['tensorrt'] = None; import masc_engine, masc_engine.engine.bundle, "
        "masc_engine.engine.backends.tensorrt, masc_engine.cli.export_cmd; print('ok')"
    )
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
    res = CliRunner().invoke(
        main, ["--model", "random:tiny-naflex", "--out", str(out), "--backend", "tensorrt", "--precision", "fp16"]
    )
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

    def shapes(b, n):
        return {"pixel_values": (b, n, 768), "pixel_attention_mask": (b, n), "position_weights": (b, n, 256)}

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
    for key, other in [
        ("tensorrt_version", "10.3.0"),
        ("gpu_name", "NVIDIA A100-SXM4-80GB"),
        ("compute_capability", "8.0"),
    ]:
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
    res = CliRunner().invoke(
        main, ["--out", str(bundle_copy), "--backend", "tensorrt", "--precision", "fp32", "--engines-only"]
    )
    assert res.exit_code != 0 and "holds fp16 graphs" in res.output and "--precision fp32" in res.output
    res = CliRunner().invoke(
        main,
        [
            "--out",
            str(bundle_copy),
            "--backend",
            "tensorrt",
            "--engines-only",
            "--max-batch",
            "2",
            "--max-outs-per-ref",
            "4",
        ],
    )
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
    assert np.allclose(
        [c for c, _ in feeds_cp.score(ref, w, outs)], [c for c, _ in GraphCP(cp_ort).score(ref, w, outs)]
    )

    # Refusals, in order of the checks.
    with pytest.raises(BackendUnavailableError, match="CUDA GPUs only"):
        b.runner("cp", backend="tensorrt", provider="cpu")
    with pytest.raises(BundleError, match="no TensorRT bf16 engines.*--precision bf16 --engines-only"):
        b.runner("cp", backend="tensorrt", provider="cuda", precision="bf16")
    with pytest.raises(ProfileError, match=r"\[1, 1024\]"):
        b.runner("pool", backend="tensorrt", provider="cuda").run(
            {"hidden": np.zeros((1, 1025, 64), np.float32), "key_padding_mask": np.zeros((1, 1025), bool)}
        )
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


def test_fp32_engines_clear_tf32_and_take_fp32_graphs(fake_trt, bundle_copy, monkeypatch):
    fake_trt.build_engines(bundle_copy, graphs=["pool"])  # the bundle's precision: fp32
    (build,) = fake_tensorrt.BUILDS
    assert build["strongly_typed"] and build["flags"] == set()  # TF32 cleared
    assert "FLOAT" in build["initializer_dtypes"] and "FLOAT16" not in build["initializer_dtypes"]
    assert json.loads((bundle_copy / "tensorrt-fp32" / "engines.json").read_text())["precision"] == "fp32"
    with pytest.raises(BundleError, match="holds fp32 graphs.*--precision bf16"):
        fake_trt.build_engines(bundle_copy, precision="bf16")
    # A bf16 bundle on a GPU without bf16 (the manifest's mode is what build_engines reads).
    m = json.loads((bundle_copy / "manifest.json").read_text())
    m["precision"] = {"mode": "bf16"}
    (bundle_copy / "manifest.json").write_text(json.dumps(m))
    from masc_engine.engine.backends import trt_device

    monkeypatch.setattr(trt_device, "_query_gpu", lambda device: ("Tesla T4", "7.5"))
    with pytest.raises(BackendUnavailableError, match="bf16 needs compute capability"):
        fake_trt.build_engines(bundle_copy)


@pytest.mark.parametrize("n_outs", [32, 100])
def test_cp_scores_any_outputs_per_reference_through_trt_and_ort(fake_trt, bundle_copy, n_outs):
    """One reference against 32 / 100 outputs (the DreamBench shape is 32): GraphCP packs within the
    engine profile's outs_per_ref range (16 by default), and CP equals the ORT cp graph's."""
    from masc_engine.runtime.cp_device import GraphCP
    from masc_engine.runtime.heads import masked_maxcos
    from masc_engine.runtime.masks import cp_keep
    from masc_engine.tolerances import CP_HEAD_ATOL

    fake_trt.build_engines(bundle_copy, graphs=["cp"])  # masc-export's defaults
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
    numpy_head = [masked_maxcos(ref, o, w)[0] for o in outs]
    assert len(got) == n_outs
    np.testing.assert_allclose(got, want, rtol=0, atol=CP_HEAD_ATOL)
    np.testing.assert_allclose(got, numpy_head, rtol=0, atol=CP_HEAD_ATOL)
    feeds = {
        "ref_tokens": ref[None],
        "ref_keep": cp_keep(w)[None],
        "out_tokens": np.zeros((1, 17, 8, 64), np.float32),
        "out_valid": np.ones((1, 17, 8), bool),
    }
    with pytest.raises(ProfileError, match=r"'outs_per_ref' is 17.*\[1, 16\].*--max-outs-per-ref"):
        cp_trt.run(feeds)


# ------------------------------------------------------------------ checked calls, order, threads


@pytest.fixture
def trt_engines(fake_trt, bundle_copy):
    fake_trt.build_engines(bundle_copy)
    fake_tensorrt.FAIL.clear()
    fake_tensorrt.CALLS.clear()
    yield Bundle(bundle_copy)
    fake_tensorrt.FAIL.clear()


def _pool_feeds(b=2, n=30):
    rng = np.random.default_rng(0)
    return {"hidden": rng.normal(size=(b, n, 64)).astype(np.float32), "key_padding_mask": rng.random((b, n)) < 0.3}


@pytest.mark.parametrize(
    "call,match",
    [
        ("set_input_shape", r"set_input_shape\('hidden', \(2, 30, 64\)\) failed"),
        ("set_tensor_address", r"set_tensor_address\('hidden'\) failed for shape \(2, 30, 64\)"),
        ("execute_async_v3", r"execution of 'pool' failed"),
        ("data_dependent", r"output 'pooled' has shape \(-1, -1\).*data-dependent"),
    ],
)
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
    """As OrtRunner.run_device: outputs and context memory are allocated, then the device is
    synchronised, then copies are queued on the engine's stream, tensors bound, the engine run."""
    runner = trt_engines.runner("pool", backend="tensorrt", provider="cuda")
    dev = fake_tensorrt.NumpyDevice()
    feeds = {k: dev.from_host(v) for k, v in _pool_feeds().items()}
    feeds["key_padding_mask"] = _pool_feeds()["key_padding_mask"]  # a host input: staged, copied on the stream
    fake_tensorrt.CALLS.clear()
    out = runner.run_device(feeds, dev)
    names = [c for c, _ in fake_tensorrt.CALLS]
    last_empty = max(i for i, c in enumerate(names) if c == "empty")
    sync = names.index("synchronize", last_empty)
    first_bind = names.index("set_tensor_address")
    assert names.index("set_device_memory") < sync < names.index("copy_to_device") < first_bind
    assert (
        last_empty
        < sync
        < first_bind
        < names.index("execute_async_v3")
        < names.index("record_event")
        < names.index("event.synchronize")
    )
    empties = [x[1] for x in fake_tensorrt.CALLS if x[0] == "empty"]
    assert empties[:3] == [(2, 30), (2, 64), (2, 30)]  # the staged mask's device buffer, then the outputs
    assert len(empties) == 4 and len(empties[3]) == 1  # the context memory (bytes), made once
    np.testing.assert_array_equal(dev.to_host(out["pooled"]), trt_engines.runner("pool").run(_pool_feeds())["pooled"])


def test_one_trt_scorer_serves_several_threads_on_the_device_path(trt_engines):
    """Four threads share one device-resident TensorRT scorer (fake engines, numpy 'device'): each
    gets the scores a sequential run gives."""
    from concurrent.futures import ThreadPoolExecutor

    from support import blob_mask
    from masc_engine.export.validate import synthetic_image
    from masc_engine.runtime.scorer import Pair, Scorer

    sizes = [(224, 288), (160, 480), (333, 217), (256, 256), (97, 203), (300, 301), (181, 377), (200, 150)]
    pairs = [
        Pair(
            synthetic_image(h, w, i),
            blob_mask(h, w, i),
            synthetic_image(w, h, i + 50),
            blob_mask(w, h, i + 50, frac=0.2),
            ["a dog on the beach", "a red cat"][i % 2],
            ["dog", "cat"][i % 2],
        )
        for i, (h, w) in enumerate(sizes)
    ]
    scorer = Scorer(
        trt_engines,
        backend="tensorrt",
        provider="cuda",
        device_resident=True,
        array_device=fake_tensorrt.NumpyDevice(),
        batch_size=2,
    )
    want = [(r.cp, r.pf) for r in Scorer(trt_engines, cp_head="graph").score_batch(pairs)]
    chunks = [pairs[i::4] for i in range(4)]
    with ThreadPoolExecutor(4) as ex:
        got = list(ex.map(lambda ps: [(r.cp, r.pf) for r in scorer.score_batch(ps)], chunks * 2))
    for j, res in enumerate(got):
        idx = list(range(len(pairs)))[j % 4 :: 4]
        np.testing.assert_allclose(res, [want[i] for i in idx], rtol=0, atol=BATCH_INVARIANCE_ATOL)


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


# ------------------------------------------------------------------ the fake's unkindness, and the guards it needs

#: The TensorRT backend's modules: the runner, the builder, the lazy import and GPU facts.
TRT_SOURCES = [
    REPO / "src" / "masc_engine" / "engine" / "backends" / f"{m}.py" for m in ("tensorrt", "trt_build", "trt_device")
]


def mutant(old: str, new: str) -> types.ModuleType:
    """The backend module holding a guard (engine/backends/tensorrt.py, trt_build.py or
    trt_device.py) with the guard removed (``old`` -> ``new``, which must occur once in all of
    them), loaded as a module beside the real one (what it imports from the others is theirs,
    wired to the fake by the ``fake_trt`` fixture) and wired to the fake like that fixture wires
    the real one. The runner's ``load_runner`` is a runner mutant's, ``build_engines`` a builder
    mutant's."""
    hits = [(path, path.read_text()) for path in TRT_SOURCES]
    hits = [(path, src) for path, src in hits if old in src]
    assert len(hits) == 1 and hits[0][1].count(old) == 1, (
        f"mutation site found {sum(src.count(old) for _, src in hits)} times: {old!r}"
    )
    path, src = hits[0]
    mod = types.ModuleType(f"masc_engine.engine.backends._{path.stem}_mutant")
    mod.__package__ = "masc_engine.engine.backends"
    mod.__file__ = str(path)
    exec(compile(src.replace(old, new), str(path), "exec"), mod.__dict__)  # noqa: S102 - our own source
    wiring = {
        "CupyDevice": fake_tensorrt.NumpyDevice,
        "_query_gpu": lambda device: (INFO["gpu_name"], INFO["compute_capability"]),
    }
    for name, value in wiring.items():
        if name in mod.__dict__:
            setattr(mod, name, value)
    return mod


def real_module():
    from masc_engine.engine.backends import tensorrt as trt_backend

    return trt_backend


def _cp_feeds(r=1, k=1, n=12, m=9):
    rng = np.random.default_rng(r * 100 + k)
    return {
        "ref_tokens": rng.normal(size=(r, n, 64)).astype(np.float32),
        "ref_keep": rng.random((r, n)) < 0.7,
        "out_tokens": rng.normal(size=(r, k, m, 64)).astype(np.float32),
        "out_valid": np.ones((r, k, m), bool),
    }


def test_outputs_are_read_after_the_engine_stream_synchronizes(trt_engines):
    """Kernels and copies complete on the stream's worker after a delay: a runner that returned
    before synchronizing its stream would hand back NaN (the buffers' uninitialised contents)."""
    fake_tensorrt.LATENCY_S = 0.05
    feeds = _pool_feeds()
    want = trt_engines.runner("pool").run(feeds)

    def check(mod):
        runner = mod.load_runner(trt_engines, "pool")
        got = runner.run(feeds)
        dev = fake_tensorrt.NumpyDevice()
        on_device = runner.run_device({k: dev.from_host(v) for k, v in feeds.items()}, dev)
        for k in want:
            np.testing.assert_array_equal(got[k], want[k])
            np.testing.assert_array_equal(dev.to_host(on_device[k]), want[k])

    check(real_module())
    no_sync = mutant("        job.event.synchronize()  # the engine and the copies back are done\n", "")
    with pytest.raises(AssertionError, match="Mismatch|nan"):
        check(no_sync)


def test_execution_context_none_is_a_typed_error(trt_engines):
    """``create_execution_context`` returns None when TensorRT cannot give a context memory."""
    from masc_engine.errors import MascEngineError

    fake_tensorrt.FAIL.add("create_execution_context")

    def check(mod):
        with pytest.raises(
            MascEngineError,
            match=r"execution context for engine 'pool' \(optimization profile 0, "
            r"max shapes .*'hidden': \[16, 1024, 64\]",
        ):
            mod.load_runner(trt_engines, "pool")

    check(real_module())
    with pytest.raises(pytest.fail.Exception, match="DID NOT RAISE"):  # the None kept, to fail later
        check(
            mutant(
                "        if self.context is None:\n            raise DeviceMemoryError",
                "        if False:\n            raise DeviceMemoryError",
            )
        )


def test_an_engine_that_does_not_deserialize_is_a_typed_error(trt_engines):
    """``deserialize_cuda_engine`` returns None for a plan of another TensorRT version or GPU."""
    fake_tensorrt.FAIL.add("deserialize_cuda_engine")

    def check(mod):
        with pytest.raises(
            EngineCompatibilityError,
            match=r"TensorRT 11\.4\.0\.106 could not deserialize "
            r".*tensorrt-fp32/pool\.engine \(built with another",
        ):
            mod.load_runner(trt_engines, "pool")

    check(real_module())
    with pytest.raises(AttributeError, match="NoneType"):  # the None kept, failing on its first use
        check(
            mutant(
                "        if self.engine is None:\n            raise EngineCompatibilityError",
                "        if False:\n            raise EngineCompatibilityError",
            )
        )


def test_a_just_built_plan_that_does_not_deserialize_is_a_build_error(fake_trt, bundle_copy):
    from masc_engine.engine.backends.tensorrt import EngineBuildError

    fake_tensorrt.FAIL.add("deserialize_cuda_engine")

    def check(mod):
        with pytest.raises(EngineBuildError, match=r"could not deserialize the engine it just built for 'cp'"):
            mod.build_engines(bundle_copy, graphs=["cp"])

    check(fake_trt)
    with pytest.raises(AttributeError, match="NoneType"):
        check(
            mutant(
                '    if engine is None:\n        raise EngineBuildError(f"TensorRT could not deserialize',
                '    if False:\n        raise EngineBuildError(f"TensorRT could not deserialize',
            )
        )


def test_a_network_that_cannot_be_created_is_a_build_error(fake_trt, bundle_copy):
    from masc_engine.engine.backends.tensorrt import EngineBuildError

    fake_tensorrt.FAIL.add("create_network")

    def check(mod):
        with pytest.raises(EngineBuildError, match=r"TensorRT could not create a network for engine 'cp'"):
            mod.build_engines(bundle_copy, graphs=["cp"])

    check(fake_trt)
    with pytest.raises(AttributeError, match="NoneType"):
        check(
            mutant(
                "    if network is None:\n        raise EngineBuildError",
                "    if False:\n        raise EngineBuildError",
            )
        )


def test_a_failed_memory_size_query_is_named(trt_engines):
    """``update_device_memory_size_for_shapes`` reports failure with 0: unchecked, the context gets
    no memory and execution fails with a generic message."""
    from masc_engine.errors import MascEngineError

    def check(mod):
        runner = mod.load_runner(trt_engines, "pool")
        fake_tensorrt.FAIL.add("update_device_memory_size_for_shapes")
        try:
            with pytest.raises(
                MascEngineError,
                match=r"engine 'pool': update_device_memory_size_for_shapes\(\) "
                r"returned 0 \(failure\) for input shapes "
                r"\{'hidden': \(2, 30, 64\), 'key_padding_mask': \(2, 30\)\}",
            ):
                runner.run(_pool_feeds())
        finally:
            fake_tensorrt.FAIL.discard("update_device_memory_size_for_shapes")

    check(real_module())
    with pytest.raises(AssertionError, match="Regex pattern did not match"):  # "execution of 'pool' failed" instead
        check(mutant("        if size <= 0:  # the binding reports", "        if size < 0:  # the binding reports"))


def test_context_memory_growth_out_of_memory_is_a_typed_error(trt_engines):
    """A call larger than any before grows the context memory; where the device has no room for
    it, the error names the engine, the bytes and the shapes (not CuPy's bare OutOfMemoryError)."""
    feeds = _cp_feeds(2, 3, n=40, m=50)

    def check(mod):
        runner = mod.load_runner(trt_engines, "cp")
        runner.run(_cp_feeds())
        need = runner.engine._activation({k: v.shape for k, v in feeds.items()})
        fake_tensorrt.MEMORY_LIMIT = fake_tensorrt.LEDGER.used + int(0.75 * need)  # inputs, outputs: 0.5 need
        try:
            with pytest.raises(
                DeviceMemoryError,
                match=r"engine 'cp' needs 0\.\d\d GiB of context memory for input "
                r"shapes \{'ref_tokens': \(2, 40, 64\).* GiB are free",
            ):
                runner.run(feeds)
        finally:
            fake_tensorrt.MEMORY_LIMIT = 1 << 40

    check(real_module())
    with pytest.raises(fake_tensorrt.OutOfMemoryError):
        check(
            mutant(
                "            except Exception as e:  # noqa: BLE001 - CuPy raises OutOfMemoryError",
                "            except ImportError as e:",
            )
        )


def test_a_refused_optimization_profile_is_named(fake_trt, bundle_copy):
    """``add_optimization_profile`` returns -1 for a profile TensorRT refuses; unchecked, the build
    fails later with a generic message."""
    from masc_engine.errors import MascEngineError

    fake_tensorrt.FAIL.add("add_optimization_profile")

    def check(mod):
        with pytest.raises(
            MascEngineError,
            match=r"engine 'cp': TensorRT refused optimization profile 0 "
            r"\(\{'ref_tokens': \[16, 1024, 64\]",
        ):
            mod.build_engines(bundle_copy, graphs=["cp"])

    check(fake_trt)
    with pytest.raises(AssertionError, match="Regex pattern did not match"):  # the generic message instead
        check(
            mutant(
                "        if config.add_optimization_profile(profile) < 0:",
                "        if config.add_optimization_profile(profile) < -1:",
            )
        )


def test_set_shape_refusal_names_engine_profile_and_shapes(fake_trt, bundle_copy, tmp_path):
    """The real ``IOptimizationProfile.set_shape`` raises RuntimeError unless min <= opt <= max."""
    from masc_engine.errors import MascEngineError

    bad = [
        {
            "hidden": {"min": [1, 1, 64], "opt": [4, 2048, 64], "max": [8, 1024, 64]},
            "key_padding_mask": {"min": [1, 1], "opt": [4, 512], "max": [8, 1024]},
        }
    ]

    def check(mod):
        with pytest.raises(
            MascEngineError,
            match=r"engine 'pool', optimization profile 0: TensorRT refused input "
            r"'hidden' min \[1, 1, 64\] opt \[4, 2048, 64\] max \[8, 1024, 64\] "
            r"\(Shape provided for max is inconsistent",
        ):
            mod.build_engine(bundle_copy / "pool.onnx", tmp_path / "pool.engine", "fp32", bad)

    check(fake_trt)
    with pytest.raises(RuntimeError, match="inconsistent"):  # untyped, and naming neither engine nor profile
        check(mutant("            except (RuntimeError, ValueError, TypeError) as e:", "            except () as e:"))


def test_parser_rejections_and_failed_builds_are_typed_errors(fake_trt, bundle_copy, tmp_path):
    from masc_engine.engine.backends.tensorrt import EngineBuildError

    entry = json.loads((bundle_copy / "manifest.json").read_text())
    profile = tp.profile_shapes(entry["graphs"]["vision"], tp.default_axis_ranges(entry, max_batch=2))
    # The fused ONNX Runtime graphs hold com.microsoft contrib ops, which TensorRT's parser does not import.
    with pytest.raises(
        EngineBuildError,
        match=r"parser rejected .*vision.ort-cpu.onnx \(engine 'vision'\): node \d+ "
        r"\(SkipLayerNormalization\): .* node \d+ \(Attention\): No importer "
        r"registered for op: Attention \(domain com.microsoft\)",
    ):
        fake_trt.build_engine(
            bundle_copy / "vision.ort-cpu.onnx", tmp_path / "v.engine", "fp32", [profile], graph="vision"
        )
    fake_tensorrt.FAIL.add("build")
    with pytest.raises(EngineBuildError, match=r"failed to build engine 'vision' .*'pixel_values': \[2, 1024, 768\]"):
        fake_trt.build_engine(bundle_copy / "vision.onnx", tmp_path / "v.engine", "fp32", [profile], graph="vision")
    assert not (tmp_path / "v.engine").exists()


def _typed_graph(path, a_type, b_type):
    """A one-Add graph whose two inputs have the given ONNX types (a float32 output)."""
    import onnx
    from onnx import TensorProto, helper

    cast = helper.make_node("Cast", ["s"], ["y"], to=TensorProto.FLOAT)
    g = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["s"]), cast],
        "g",
        [helper.make_tensor_value_info("a", a_type, [-1, 4]), helper.make_tensor_value_info("b", b_type, [-1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [-1, 4])],
    )
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return {"a": {"min": [1, 4], "opt": [2, 4], "max": [4, 4]}, "b": {"min": [1, 4], "opt": [2, 4], "max": [4, 4]}}


@pytest.mark.parametrize(
    "a_type,b_type,why",
    [
        (1, 10, r"Add node '': input types \['FLOAT', 'FLOAT16'\] differ"),  # no implicit cast in strong typing
        (4, 4, r"tensor 'a' has ONNX type UINT16, which TensorRT has no DataType for"),
    ],
)
def test_a_strongly_typed_build_fails_on_a_type_it_cannot_take(fake_trt, tmp_path, a_type, b_type, why):
    from masc_engine.engine.backends.tensorrt import EngineBuildError

    profile = _typed_graph(tmp_path / "g.onnx", a_type, b_type)
    with pytest.raises(EngineBuildError, match=r"failed to build engine 'g'"):
        fake_trt.build_engine(tmp_path / "g.onnx", tmp_path / "g.engine", "fp32", [profile])
    assert any(__import__("re").search(why, e) for e in fake_tensorrt.BUILD_ERRORS), fake_tensorrt.BUILD_ERRORS
    fake_tensorrt.BUILD_ERRORS.clear()
    profile = _typed_graph(tmp_path / "ok.onnx", 10, 10)  # both fp16: the strongly typed network takes it
    fake_trt.build_engine(tmp_path / "ok.onnx", tmp_path / "ok.engine", "fp16", [profile])
    assert not fake_tensorrt.BUILD_ERRORS


def test_the_fake_stream_does_queued_work_only_at_synchronize():
    """The fake CuPy stream's ``synchronize()`` matters: a queued copy has not happened, however
    long the host waits, until the stream is synchronized; then it is logged on the fake clock."""
    import time

    fake_tensorrt.reset()
    dev = fake_tensorrt.NumpyDevice()
    stream = dev.new_stream()
    dst = dev.empty((3,), np.float32)
    dev.copy_to_device(np.arange(3, dtype=np.float32), dst, stream)
    time.sleep(5 * fake_tensorrt.LATENCY_S)
    assert np.isnan(dst).all() and not fake_tensorrt.INTERVALS
    stream.synchronize()
    np.testing.assert_array_equal(dst, [0, 1, 2])
    assert fake_tensorrt.INTERVALS == [(stream.ptr, "h2d", 0.0, fake_tensorrt.DURATION_S["h2d"])]
    assert fake_tensorrt.HOST_CLOCK[0] == fake_tensorrt.DURATION_S["h2d"]  # the host waited for it


def test_one_trt_logger_per_process(trt_engines):
    """Four builds and four runners (and their deserializations) share one trt.Logger."""
    for graph in ("vision", "pool", "text", "cp"):
        trt_engines.runner(graph, backend="tensorrt", provider="cuda")
    assert len(fake_tensorrt.LOGGERS) == 1


def test_execute_async_v3_takes_the_stream_handle(trt_engines):
    def check(mod):
        got = mod.load_runner(trt_engines, "pool").run(_pool_feeds())
        assert np.isfinite(got["pooled"]).all()

    check(real_module())
    with pytest.raises(TypeError, match="(?s)incompatible function arguments.*stream_handle: int"):
        check(mutant("ctx.execute_async_v3(stream.ptr))", "ctx.execute_async_v3(stream))"))


# ------------------------------------------------------------------ device memory: plan, budget, user-managed contexts


def test_memory_plan_is_written_to_engines_json(fake_trt, bundle_copy):
    fake_trt.build_engines(bundle_copy)
    side = json.loads((bundle_copy / "tensorrt-fp32" / "engines.json").read_text())
    plan = side["memory_plan"]
    assert plan["budget_source"].startswith("free device memory at build")
    assert plan["max_batch"] == 16 and plan["max_outs_per_ref"] == 16
    total = 0
    for graph, e in side["engines"].items():
        mem = e["memory"]
        # the graph file and its external weight file (text.onnx.data, vision.onnx.data), where it has one
        files = [bundle_copy / f"{graph}.onnx", bundle_copy / f"{graph}.onnx.data"]
        assert mem["weights_bytes"] == sum(f.stat().st_size for f in files if f.exists()) > 0
        assert mem["profile_max"]["shapes"] == {k: v["max"] for k, v in e["profiles"][0].items()}
        assert mem["profile_max"]["activation_bytes"] > 0 and mem["profile_max"]["io_bytes"] > 0
        assert len(mem["device_memory_bytes"]) == 1 and mem["device_memory_bytes"][0] > 0  # TensorRT's own figure
        total += mem["weights_bytes"] + mem["profile_max"]["activation_bytes"] + mem["profile_max"]["io_bytes"]
    assert plan["total_bytes"] == total
    cp = side["engines"]["cp"]["memory"]["profile_max"]
    # 16 refs x 16 outputs x 1024 x 1024 cosines: fp32 with its fp32 reduction, plus normalised copies
    assert cp["activation_bytes"] == (16 * 1024 + 16 * 16 * 1024) * 64 * 4 + 16 * 16 * 1024 * 1024 * 8


def test_profile_maxima_are_chosen_from_the_budget(fake_trt, bundle_copy, caplog):
    from masc_engine.cli.export_cmd import main

    manifest = json.loads((bundle_copy / "manifest.json").read_text())
    weights = {g: (bundle_copy / e["file"]).stat().st_size for g, e in manifest["graphs"].items()}
    _, full = tp.choose_ranges(manifest, "fp32", weights, 1 << 50)
    budget_gib = full["total_bytes"] / tp.GIB / 3  # a third of what batch 16 needs
    with caplog.at_level("INFO", logger="masc_engine"):
        fake_trt.build_engines(bundle_copy, gpu_memory_budget=budget_gib)
    side = json.loads((bundle_copy / "tensorrt-fp32" / "engines.json").read_text())
    plan = side["memory_plan"]
    assert plan["max_batch"] < 16 and plan["total_bytes"] <= plan["usable_bytes"] < plan["budget_bytes"]
    assert side["axis_ranges"]["batch"][2] == plan["max_batch"]
    assert plan["budget_source"] == f"--gpu-memory-budget {budget_gib:g} GiB"
    assert any("profile maxima lowered to fit" in r.getMessage() and r.levelname == "WARNING" for r in caplog.records)
    res = CliRunner().invoke(
        main, ["--out", str(bundle_copy), "--backend", "tensorrt", "--engines-only", "--gpu-memory-budget", "0.01"]
    )
    assert res.exit_code != 0 and "even at batch 1" in res.output and "budget" in res.output


def test_contexts_hold_memory_for_the_shapes_run(trt_engines):
    runner = trt_engines.runner("cp", backend="tensorrt", provider="cuda")
    assert runner.device_memory_bytes == 0  # user-managed: nothing reserved at creation
    static = runner.engine.device_memory_size_v2  # what a static context would hold for its life
    runner.run(_cp_feeds(1, 1))
    small = runner.device_memory_bytes
    assert 0 < small < static / 1000
    runner.run(_cp_feeds(2, 3, n=40, m=50))
    assert runner.device_memory_bytes > small  # grown for a larger call
    grown = runner.device_memory_bytes
    runner.run(_cp_feeds(1, 1))
    assert runner.device_memory_bytes == grown  # reused, not shrunk
    before = fake_tensorrt.LEDGER.used
    runner.close()
    assert runner.device_memory_bytes == 0 and fake_tensorrt.LEDGER.used < before
    from masc_engine.engine.backends.tensorrt import TensorRTCallError

    with pytest.raises(TensorRTCallError, match="closed"):
        runner.run(_cp_feeds())


def test_user_managed_contexts_let_engines_share_a_gpu(trt_engines):
    """Two CP runners on a device with room for one profile maximum: with user-managed memory both
    run (each holds what its calls need); static contexts would each hold their maximum."""
    side = tp.read_sidecar(trt_engines.path, "fp32")
    need = {
        g: tp.engine_need_bytes(e, (trt_engines.path / "tensorrt-fp32" / e["file"]).stat().st_size)
        for g, e in side["engines"].items()
    }
    others = sum(n for g, n in need.items() if g != "cp")  # the rest of the set must fit too
    fake_tensorrt.MEMORY_LIMIT = fake_tensorrt.LEDGER.used + others + int(1.5 * need["cp"])

    def check(mod):
        first = mod.load_runner(trt_engines, "cp")
        first.run(_cp_feeds())
        second = mod.load_runner(trt_engines, "cp")
        second.run(_cp_feeds())

    check(real_module())
    with pytest.raises(DeviceMemoryError, match="execution context|together"):
        check(
            mutant(
                "self.engine.create_execution_context(trt.ExecutionContextAllocationStrategy.USER_MANAGED)",
                "self.engine.create_execution_context(trt.ExecutionContextAllocationStrategy.STATIC)",
            )
        )


def test_engines_follow_the_shapes_with_the_activation_resize_preview_feature(trt_engines):
    """Built with ``RUNTIME_ACTIVATION_RESIZE_10_10``, a context's memory follows the shapes run, and
    engines.json states both figures; without it (the fake, as the hardware, then sizes every
    context for the profile maximum) the runner's memory would be the maximum for the smallest call."""
    side = tp.read_sidecar(trt_engines.path, "fp32")
    for e in side["engines"].values():
        mem = e["memory"]
        assert mem["activation_resize"] is True and e["activation_resize"] is True
        assert (
            0
            < mem["shape_following_bytes"]["min"]
            <= mem["shape_following_bytes"]["opt"]
            < mem["device_memory_bytes"][0]
        )
    assert all(b["preview"] == {"RUNTIME_ACTIVATION_RESIZE_10_10"} for b in fake_tensorrt.BUILDS[-4:])

    def check(mod, bundle):
        runner = mod.load_runner(bundle, "cp")
        runner.run(_cp_feeds(1, 1))
        assert 0 < runner.device_memory_bytes < runner.engine.device_memory_size_v2 / 1000

    check(real_module(), trt_engines)
    mod = mutant("    resize = enable_activation_resize(trt, config)", "    resize = False")
    mod.build_engines(trt_engines.path)
    side = tp.read_sidecar(trt_engines.path, "fp32")
    cp = side["engines"]["cp"]["memory"]
    assert cp["activation_resize"] is False and cp["shape_following_bytes"]["min"] == cp["device_memory_bytes"][0]
    with pytest.raises(AssertionError):
        check(real_module(), Bundle(trt_engines.path))


def test_a_bundle_whose_engines_would_not_fit_together_is_refused_at_the_first_load(trt_engines):
    """Each engine fits alone, the set (text included, which the scorer loads later) does not: the
    first load refuses in one line naming every engine's figure, before anything is deserialized."""
    from masc_engine.runtime.scorer import Scorer

    side = tp.read_sidecar(trt_engines.path, "fp32")
    need = {
        g: tp.engine_need_bytes(e, (trt_engines.path / "tensorrt-fp32" / e["file"]).stat().st_size)
        for g, e in side["engines"].items()
    }
    fake_tensorrt.MEMORY_LIMIT = fake_tensorrt.LEDGER.used + sum(need.values()) - need["text"] // 2
    with pytest.raises(DeviceMemoryError) as e:
        Scorer(
            trt_engines,
            backend="tensorrt",
            provider="cuda",
            device_resident=True,
            array_device=fake_tensorrt.NumpyDevice(),
        )
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("TensorRT fp32 engines of ")
    assert f"need up to {sum(need.values()) / tp.GIB:.2f} GiB of device memory together" in msg
    assert f"text {need['text'] / tp.GIB:.2f}" in msg and "text engine included" in msg
    assert "--engines-only --gpu-memory-budget" in msg and not fake_tensorrt.RUNS
    fake_tensorrt.MEMORY_LIMIT = fake_tensorrt.LEDGER.used + sum(need.values())  # exactly enough: all four load
    s = Scorer(
        trt_engines, backend="tensorrt", provider="cuda", device_resident=True, array_device=fake_tensorrt.NumpyDevice()
    )
    assert s.text is not None


def test_a_load_that_would_not_fit_is_refused_before_the_first_batch(trt_engines, monkeypatch):
    deserialized = []
    real = fake_tensorrt.Runtime.deserialize_cuda_engine
    monkeypatch.setattr(
        fake_tensorrt.Runtime,
        "deserialize_cuda_engine",
        lambda self, serialized_engine: deserialized.append(1) or real(self, serialized_engine),
    )
    fake_tensorrt.MEMORY_LIMIT = fake_tensorrt.LEDGER.used + (64 << 20)
    with pytest.raises(DeviceMemoryError) as e:
        trt_engines.runner("vision", backend="tensorrt", provider="cuda")
    msg = str(e.value)
    assert "\n" not in msg and not deserialized
    assert msg.startswith("TensorRT fp32 engine 'vision' needs up to ") and "GiB of device memory" in msg
    assert "fake-cuda has 0.06 GiB free" in msg and "--engines-only --gpu-memory-budget" in msg


# ------------------------------------------------------------------ scorers release device memory deterministically


def _pairs(n=4):
    from support import blob_mask
    from masc_engine.export.validate import synthetic_image
    from masc_engine.runtime.scorer import Pair

    return [
        Pair(
            synthetic_image(160, 224, i),
            blob_mask(160, 224, i),
            synthetic_image(224, 160, i + 9),
            blob_mask(224, 160, i + 9, frac=0.2),
            "a red dog on the beach",
            "dog",
        )
        for i in range(n)
    ]


def test_scorer_close_and_context_manager_free_device_memory(trt_engines):
    import gc

    from masc_engine.runtime.scorer import Scorer

    gc.collect()  # earlier tests' garbage out of the baseline
    used = fake_tensorrt.LEDGER.used
    with Scorer(
        trt_engines,
        backend="tensorrt",
        provider="cuda",
        device_resident=True,
        array_device=fake_tensorrt.NumpyDevice(),
        batch_size=2,
    ) as s:
        results = s.score_batch(_pairs())
        runners = [s.vision, s.pool, s.text, s._graph_cp.runner]
        assert fake_tensorrt.LEDGER.used > used
    assert all(r.context is None and r.device_memory_bytes == 0 for r in runners)
    assert fake_tensorrt.LEDGER.used == used  # no gc pass needed
    assert all(np.isfinite(r.cp) for r in results)
    s.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        _ = s.text


@pytest.mark.parametrize("backend", ["onnxruntime", "tensorrt"])
def test_a_scorer_is_freed_without_the_cycle_collector(trt_engines, backend):
    """No reference cycle holds a scorer (and so its sessions or engines): the last reference
    going frees it at once, with the cycle collector off."""
    import gc
    import weakref

    from masc_engine.runtime.scorer import Scorer

    kwargs = (
        {
            "backend": "tensorrt",
            "provider": "cuda",
            "device_resident": True,
            "array_device": fake_tensorrt.NumpyDevice(),
        }
        if backend == "tensorrt"
        else {}
    )
    gc.collect()
    gc.disable()
    try:
        s = Scorer(trt_engines, **kwargs)
        _ = s.text  # the lazily made runner too
        s.score_batch(_pairs(1))
        ref, vision = weakref.ref(s), weakref.ref(s.vision)
        del s
        assert ref() is None and vision() is None
    finally:
        gc.enable()


# ------------------------------------------------------------------ copies overlapped with compute


def test_overlapped_encoding_equals_serial(trt_engines, monkeypatch):
    """Preprocessing of batch n+1 on a worker thread while batch n runs gives the serial path's
    tokens and scores (the overlap itself is counted on the fake clock, below, not in wall time)."""
    import time

    from masc_engine.runtime.pipeline import encode_images_overlapped, plan_batches
    from masc_engine.runtime.scorer import EncodedPair, Scorer

    fake_tensorrt.LATENCY_S = 0.04
    dev = fake_tensorrt.NumpyDevice()
    scorer = Scorer(
        trt_engines, backend="tensorrt", provider="cuda", device_resident=True, array_device=dev, batch_size=2
    )
    pairs = _pairs(6)
    images = [p.out_image for p in pairs] + [p.ref_image for p in pairs]
    assert len(plan_batches(images, scorer)) == 6
    real_preprocess = scorer.preprocess
    monkeypatch.setattr(scorer, "preprocess", lambda im: time.sleep(0.08) or real_preprocess(im))
    serial = scorer.encode_images(images)
    overlapped = encode_images_overlapped(scorer, images)
    for a, b in zip(serial, overlapped, strict=True):
        assert a.grid == b.grid
        np.testing.assert_array_equal(dev.to_host(a.tokens), dev.to_host(b.tokens))
    encs = dict(zip(map(id, images), overlapped))
    items = [
        EncodedPair(
            encs[id(p.ref_image)],
            scorer.mask_weights(p.ref_image, p.ref_mask, encs[id(p.ref_image)].grid, "reference"),
            encs[id(p.out_image)],
            scorer.mask_weights(p.out_image, p.out_mask, encs[id(p.out_image)].grid, "output"),
            p.prompt,
            p.object_name,
        )
        for p in pairs
    ]
    got = [(r.cp, r.pf) for r in scorer.score_encoded(items)]
    assert got == [(r.cp, r.pf) for r in scorer.score_batch(pairs)]


def _overlaps(intervals, a, b) -> int:
    """Pairs (x, y), x labelled ``a`` and y ``b`` on different lanes (stream or host), whose
    fake-clock intervals overlap."""
    xs = [i for i in intervals if i[1].startswith(a)]
    ys = [i for i in intervals if i[1].startswith(b)]
    return sum(1 for x in xs for y in ys if x is not y and x[0] != y[0] and x[2] < y[3] and y[2] < x[3])


def test_two_batches_in_flight_overlap_on_the_fake_clock_with_serial_results(trt_engines):
    """``run_pipelined`` keeps two vision batches in flight (a context, stream and pinned buffers
    each): the fake's interval log shows batch n+1's host work during batch n's engine, and two
    engines in flight at once; the serial path shows neither. Outputs equal the serial path's bit
    for bit."""
    runner = trt_engines.runner("vision", backend="tensorrt", provider="cuda")
    rng = np.random.default_rng(3)
    batches = [
        {
            "pixel_values": rng.uniform(-1, 1, (2, 40, 768)).astype(np.float32),
            "pixel_attention_mask": np.ones((2, 40), np.int64),
            "position_weights": rng.random((2, 40, 256)).astype(np.float32),
        }
        for _ in range(5)
    ]
    batches = [{k: v for k, v in b.items() if k in runner.input_names} for b in batches]

    def prepare(b):
        fake_tensorrt.host_work("prepare", 0.02)  # decode, preprocess, stacking at so400m/1024: ~20 ms
        return b

    fake_tensorrt.reset()
    serial = [runner.run(prepare(b)) for b in batches]
    serial_log = list(fake_tensorrt.INTERVALS)
    serial_end = fake_tensorrt.HOST_CLOCK[0]
    fake_tensorrt.reset()
    piped = runner.run_pipelined(batches, prepare)
    log = list(fake_tensorrt.INTERVALS)
    for a, b in zip(serial, piped, strict=True):
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])
    assert _overlaps(serial_log, "prepare", "execute") == 0 and _overlaps(serial_log, "execute", "execute") == 0
    assert _overlaps(log, "prepare", "execute") >= 4  # batch n+1 prepared while batch n computes
    assert _overlaps(log, "execute", "execute") >= 4  # two engines in flight
    assert len({i[0] for i in log if i[1] == "execute"}) == 2  # on two streams
    assert fake_tensorrt.HOST_CLOCK[0] < serial_end
    assert runner.device_memory_bytes > 0 and len(runner._slots) == 2


def test_a_pipelined_runner_collects_a_batch_before_reusing_its_slot(trt_engines):
    """Without waiting for batch n-2's event before its slot takes batch n, the slot's pinned
    buffers are refilled under it: batch n-2's outputs come back as batch n's (the fake does the
    copies only when waited for)."""
    rng = np.random.default_rng(4)
    batches = [
        {
            "hidden": rng.normal(size=(2, 30 - 3 * i, 64)).astype(np.float32),
            "key_padding_mask": rng.random((2, 30 - 3 * i)) < 0.3,
        }
        for i in range(4)
    ]
    want = [real_module().load_runner(trt_engines, "pool").run(b) for b in batches]

    def check(mod):
        got = mod.load_runner(trt_engines, "pool").run_pipelined(batches)
        for a, b in zip(want, got, strict=True):
            np.testing.assert_array_equal(a["pooled"], b["pooled"])

    check(real_module())
    with pytest.raises(AssertionError, match="Mismatch"):
        check(
            mutant(
                "                if len(pending) >= in_flight:\n                    results.append(self._finish(pending.pop(0)))\n",
                "",
            )
        )
