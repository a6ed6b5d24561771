"""The paths that need a GPU (CuPy CP head, ONNX Runtime CUDA EP, TensorRT engines), and the
prepared GPU script's CPU dry run (its memory plan and pipeline sections included).

On a machine without the hardware or package, each GPU test skips and says why. On a machine with
a GPU, bench/gpu_check.py runs these paths in one call (the CuPy and CUDA-torch paths; TensorRT
when it is installed); none of them has run on a GPU yet (docs/verification.md).
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from support import REPO

from doubles.runners import ArrayCPRunner
from masc_engine.runtime.cp_device import CPItem, GraphCP
from masc_engine.runtime.heads import masked_maxcos
from masc_engine.tolerances import CP_HEAD_ATOL, FIDELITY_MAX_ABS_DELTA


def _items(width=64, seed=0):
    rng = np.random.default_rng(seed)
    base = rng.normal(size=(1, width)).astype(np.float32)
    ref = (rng.normal(size=(40, width)) + base).astype(np.float32)
    w = rng.random(40).astype(np.float32)
    outs = [(rng.normal(size=(m, width)) + base).astype(np.float32) for m in (40, 17, 64, 1)]
    return [CPItem(ref, w, o) for o in outs]


def _check(runner, items):
    got = GraphCP(runner).score_items(items)
    for (cp, _), it in zip(got, items, strict=True):
        assert abs(cp - masked_maxcos(it.ref_tokens, it.out_tokens, it.ref_weights)[0]) <= CP_HEAD_ATOL


def _cuda_cupy():
    cupy = pytest.importorskip("cupy", reason="needs CuPy and a CUDA GPU (none here)")
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("CuPy sees no CUDA device")
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"CuPy has no usable CUDA device: {e}")
    return cupy


def test_cupy_cp_head_equals_numpy_head():
    cupy = _cuda_cupy()
    _check(ArrayCPRunner(cupy), _items())


def test_onnxruntime_cuda_provider(naflex_bundle):
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip(
            f"needs onnxruntime-gpu with the CUDA execution provider (providers here: {ort.get_available_providers()})"
        )
    from masc_engine.engine.bundle import Bundle

    runner = Bundle(naflex_bundle).runner("cp", provider="cuda")
    assert runner.provider == "CUDAExecutionProvider"
    _check(runner, _items())


def test_tensorrt_cp_engine(request, tmp_path):
    pytest.importorskip("tensorrt", reason="needs NVIDIA TensorRT and a CUDA GPU (none here)")
    import shutil

    from masc_engine.engine.backends.tensorrt import build_engines
    from masc_engine.engine.bundle import Bundle

    # Strongly typed engines: fp32 engines from the fp32 bundle, fp16 engines from the fp16 bundle.
    for precision, fixture in (("fp32", "naflex_bundle"), ("fp16", "fp16_bundle")):
        b = tmp_path / precision
        shutil.copytree(request.getfixturevalue(fixture), b)
        build_engines(b, precision=precision, graphs=["cp"], max_batch=4, max_outs_per_ref=8)
        runner = Bundle(b).runner("cp", backend="tensorrt", provider="cuda", precision=precision)
        if precision == "fp32":
            _check(runner, _items())
        else:
            got = GraphCP(runner).score_items(_items())
            for (cp, _), it in zip(got, _items(), strict=True):
                assert (
                    abs(cp - masked_maxcos(it.ref_tokens, it.out_tokens, it.ref_weights)[0]) <= FIDELITY_MAX_ABS_DELTA
                )


@pytest.mark.slow
def test_gpu_check_dry_run_executes(tmp_path):
    """The prepared GPU script runs end to end on CPU with tiny shapes (numpy for CuPy)."""
    out = tmp_path / "gpu_check.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "gpu_check.py"),
            "--dry-run",
            "--out",
            str(out),
            "--only",
            "cp_head_cupy,cp_head_torch,fidelity_tiny,throughput,memory_plan,pipeline,"
            "cupy_fp16_kernel,ort_cuda,tensorrt",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    s = json.loads(out.read_text())["sections"]
    assert s["cp_head_cupy"]["status"] == "ok" and s["cp_head_cupy"]["fp32_within_atol"] is True
    dt = s["cp_head_cupy"]["device_tokens"]
    assert dt["max_abs_delta_cp"] <= CP_HEAD_ATOL and dt["nan_where_expected"] is True
    assert s["cp_head_torch"]["status"] == "ok" and s["cp_head_torch"]["fp32_within_atol"] is True
    fid = s["fidelity_tiny"]
    assert fid["status"] == "ok" and fid["fp32_score_spread"]["nan_cp"] > 0  # a reference keeping nothing
    for p in ("fp16", "bf16"):
        g = fid[p]["gates_cp_gemm_fp32"]["gates"]
        assert fid[p]["nonfinite_tokens"] == 0 and g["no_nan_inf"]["pass"]
        assert not g["min_pairs"]["pass"]  # 132 pairs in a dry run: the gates do not count
    assert s["throughput"]["status"] == "ok"
    assert all(s[k]["status"] in ("ok", "skipped") for k in ("ort_cuda", "tensorrt", "cupy_fp16_kernel"))
    plan = s["memory_plan"]
    assert plan["status"] == "ok" and plan["fp16"]["user_managed_total_gib"] < plan["fp16"]["static_contexts_total_gib"]
    assert plan["fp16"]["fits"]["RTX 3090 (the paper's)"]["max_batch_chosen_when_64_asked"] < 64
    loop = s["pipeline"]["loop"]
    assert loop["same_results"] and loop["overlapped_s"] < loop["serial_s"]
