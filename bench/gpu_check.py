#!/usr/bin/env python
"""ONE prepared GPU check for a machine with a CUDA GPU (one call, a few minutes).

It expects CUDA, CuPy and PyTorch there, and does not assume TensorRT or the runtime's other
dependencies (onnxruntime-gpu, transformers, tokenizers, Pillow). The script runs whatever
is possible there, each section on its own (a missing package skips a section with the reason, an
error is recorded with its traceback, and results are written after every section, so a timeout
keeps what finished):

- ``env``: GPU, driver, CUDA, torch / CuPy / onnxruntime / tensorrt availability.
- ``cp_head_cupy``: the CP head (runtime/heads.py ``cp_forward``, the cp.onnx graph's computation) on the GPU
  with CuPy, through the runtime's packer (runtime/cp_device.py ``GraphCP``), against the numpy
  head (runtime/heads.py) on cases with padding, one reference x many outputs and a reference
  keeping nothing; fp32 and fp16 GEMM; ``device_tokens``: the same with the tokens already in
  CuPy memory (engine/device.py ``CupyDevice``, as ``Scorer(device_resident=True)`` feeds it);
  timing at so400m shapes (D 1152, N = M = 1024).
- ``cp_head_torch``: export/cp_head.py's torch module (the module cp.onnx is traced from) on CUDA,
  fp32 and fp16 autocast, against the numpy head.
- ``fidelity_<model>``: the reduced-precision fidelity gates (bench/fidelity_gates.py), emulated
  in PyTorch: a SigLIP2-shaped vision tower and pooling head with random weights (base and so400m
  shapes) run in fp32 and under the TensorRT precision policy (weights and GEMMs fp16 / bf16;
  LayerNorm, softmax, GELU, norms and reductions fp32), on >= 1,000 pairs of synthetic images
  including all-white, all-black and noise images, padding, and output masks leaving 1-3
  background patches. CP and PF are computed the same way from each precision's tokens.
  Not TensorRT: it shows what fp16 / bf16 arithmetic does to these scores, not what an engine does.
- ``throughput``: images/s of that tower at 1024 patches (fp32, TF32, fp16 policy) and CP pairs/s.
- ``ort_cuda``, ``tensorrt``, ``masc_metric_gpu``: run only when onnxruntime-gpu, TensorRT, or
  masc-metric + transformers are importable; otherwise skipped with the reason. ``tensorrt`` builds
  the CP engine (fp32, fp16) with user-managed context memory and records TensorRT's activation
  figure per profile next to the on-paper estimate (engine/backends/trt_profiles.py), and whether
  CUDA graph replays give the plain enqueues' outputs bit for bit (``cuda_graphs``).
- ``memory_plan``: the device-memory plan of an so400m engine set (fp16 and fp32) at the default
  profiles (batch 16, 16 outputs per reference, 1,024 patches) and at the shapes the scorer runs
  (batch 8; CP calls capped at 2**26 cosines), on paper, beside a 24 GB RTX 3090, a 141 GB H200 and
  this GPU's free memory. Pure arithmetic: the same figures in a dry run.
- ``pipeline``: whether a host-to-device copy from pinned memory on one stream overlaps a GEMM on
  another (CUDA events), pinned vs pageable copy bandwidth, and the double-buffered loop
  (engine/device.py ``overlapped``) against the serial one. Dry run: the loop with sleeps in numpy.
- ``cupy_fp16_kernel``: compiles and runs a CuPy float16 kernel, which NVRTC compiles with
  ``cuda_fp16.h`` at run time (the header the ``cupy-cuda13x[ctk]`` / ``nvidia-cuda-runtime``
  wheels ship); an error here means the install recipe misses the CUDA headers.

Usage (repo root)::

    python bench/gpu_check.py                 # on the GPU: writes bench/results/gpu_check.json
    python bench/gpu_check.py --dry-run       # tiny shapes on CPU (numpy for CuPy): checks it runs,
                                              # writes bench/results/gpu_check.dryrun.json

On a remote GPU machine from which only files under ``$OUT`` come back, run it in one call
(about 2-5 minutes on an H200, ``--budget-s`` caps it)::

    python3 bench/gpu_check.py --copy-to "$OUT" 2>&1 | tee "$OUT/gpu_check.log"

and then copies ``gpu_check.json`` from the returned files to ``bench/results/gpu_check.json``
and commits it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import platform
import subprocess
import sys
import time
import traceback
import types
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"


# --------------------------------------------------------------------------- imports


def _import_masc():
    """Import masc_engine from src/; if its __init__ cannot import (no Pillow / tokenizers /
    onnxruntime on the GPU box), install a bare package object so numpy/torch-only submodules
    (runtime.heads, runtime.cp_device, export.cp_head) still import."""
    sys.path.insert(0, str(REPO / "src"))
    try:
        import masc_engine  # noqa: F401

        return "full"
    except Exception as e:  # noqa: BLE001
        for k in [k for k in sys.modules if k == "masc_engine" or k.startswith("masc_engine.")]:
            del sys.modules[k]
        pkg = types.ModuleType("masc_engine")
        pkg.__path__ = [str(REPO / "src" / "masc_engine")]
        pkg.__version__ = "stub"
        sys.modules["masc_engine"] = pkg
        return f"stub ({type(e).__name__}: {e})"


def _fidelity_module():
    spec = importlib.util.spec_from_file_location("fidelity_gates", REPO / "bench" / "fidelity_gates.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _try_import(name):
    try:
        return __import__(name, fromlist=["_"])
    except Exception:  # noqa: BLE001
        return None


class ArrayCPRunner:
    """runtime/heads.py ``cp_forward`` (the cp graph's arithmetic) as a runner of the ``cp`` graph
    over an array module, for ``GraphCP`` (tests/doubles/runners.py has the same adapter)."""

    name = "cp"
    input_names = ["ref_tokens", "ref_keep", "out_tokens", "out_valid"]

    def __init__(self, xp=np, gemm_dtype: str = "float32"):
        self.xp, self.gemm_dtype = xp, gemm_dtype

    def run_device(self, feeds: dict, device=None) -> dict:
        from masc_engine.runtime.heads import cp_forward

        return cp_forward(
            *(self.xp.asarray(feeds[k]) for k in self.input_names), xp=self.xp, gemm_dtype=self.gemm_dtype
        )

    def run(self, feeds: dict) -> dict:
        to_host = getattr(self.xp, "asnumpy", np.asarray)
        return {k: to_host(v) for k, v in self.run_device(feeds).items()}


class Skip(Exception):
    """A section cannot run here (the reason is recorded)."""


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (np.floating, float)):
        x = float(x)
        return x if math.isfinite(x) else str(x)
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, np.bool_):
        return bool(x)
    if isinstance(x, np.ndarray):
        return _jsonable(x.tolist())
    return x


# --------------------------------------------------------------------------- config


class Config:
    def __init__(self, dry_run: bool):
        self.dry_run = dry_run
        if dry_run:
            self.models = {"tiny": dict(width=64, layers=2, heads=4, mlp=128)}
            self.budget, self.n_images, self.grid_choices = 64, 12, [(8, 8), (6, 10), (4, 4), (7, 9), (5, 12), (3, 3)]
            self.cp_bench = dict(k=4, n=64, m=64, d=64)
            self.tp_batch, self.tp_iters = 2, 1
        else:
            self.models = {
                "base": dict(width=768, layers=12, heads=12, mlp=3072),
                "so400m": dict(width=1152, layers=27, heads=16, mlp=4304),
            }
            self.budget, self.n_images = 1024, 40  # 40 x 39 = 1,560 pairs
            self.grid_choices = [(32, 32), (24, 42), (42, 24), (40, 25), (16, 16), (28, 36), (12, 20), (7, 9)]
            self.cp_bench = dict(k=64, n=1024, m=1024, d=1152)
            self.tp_batch, self.tp_iters = 16, 5
        self.patch = 16
        self.pos_grid = 16


# --------------------------------------------------------------------------- sections


def section_env(cfg, ctx):
    out = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "numpy": np.__version__,
        "masc_engine_import": ctx["masc_import"],
        "dry_run": cfg.dry_run,
    }
    torch = _try_import("torch")
    if torch is not None:
        out["torch"] = torch.__version__
        out["torch_cuda"] = torch.version.cuda
        out["cuda_available"] = bool(torch.cuda.is_available())
        if torch.cuda.is_available():
            out["gpu_name"] = torch.cuda.get_device_name(0)
            out["compute_capability"] = "%d.%d" % torch.cuda.get_device_capability(0)
            out["gpu_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
            out["bf16_supported"] = bool(torch.cuda.is_bf16_supported())
    cupy = _try_import("cupy")
    out["cupy"] = getattr(cupy, "__version__", None)
    if cupy is not None:
        try:
            out["cupy_cuda_runtime"] = int(cupy.cuda.runtime.runtimeGetVersion())
            out["cupy_devices"] = int(cupy.cuda.runtime.getDeviceCount())
        except Exception as e:  # noqa: BLE001
            out["cupy_error"] = str(e)
    ort = _try_import("onnxruntime")
    out["onnxruntime"] = getattr(ort, "__version__", None)
    out["onnxruntime_providers"] = ort.get_available_providers() if ort is not None else None
    trt = _try_import("tensorrt")
    out["tensorrt"] = getattr(trt, "__version__", None)
    for name in ("transformers", "tokenizers", "PIL", "onnx", "onnxscript", "scipy", "masc"):
        mod = _try_import(name)
        out[name] = getattr(mod, "__version__", "present") if mod is not None else None
    try:
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,compute_cap,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        out["nvidia_smi"] = smi.stdout.strip() or smi.stderr.strip()
    except Exception as e:  # noqa: BLE001
        out["nvidia_smi"] = f"unavailable: {e}"
    return out


def _cp_cases(rng, width):
    """Random (reference, weights, outputs) groups: padding, one reference x many outputs, and a
    reference keeping nothing."""
    base = rng.normal(size=(1, width)).astype(np.float32) * 1.5
    tok = lambda n: (rng.normal(size=(n, width)) + base).astype(np.float32)  # noqa: E731
    groups = []
    for n_ref, outs, empty in [
        (37, [37, 20, 51, 3, 37, 64], False),
        (24, [30, 30], False),
        (40, [12, 40, 5], False),
        (16, [16, 9], True),
        (64, [64] * 9, False),
    ]:
        w = rng.random(n_ref).astype(np.float32) * (0.5 if empty else 1.0)
        groups.append((tok(n_ref), w, [tok(m) for m in outs]))
    return groups


def _cp_accuracy(runner_factory, width, seed=0):
    from masc_engine.runtime.cp_device import CPItem, GraphCP
    from masc_engine.runtime.heads import masked_maxcos

    rng = np.random.default_rng(seed)
    items, expected = [], []
    for ref, w, outs in _cp_cases(rng, width):
        for o in outs:
            items.append(CPItem(ref, w, o))
            expected.append(masked_maxcos(ref, o, w)[0])
    res = {}
    for gemm in ("float32", "float16"):
        got = [c for c, _ in GraphCP(runner_factory(gemm), max_outs_per_ref=4, max_refs_per_call=3).score_items(items)]
        nan_ok = all(np.isnan(g) == np.isnan(e) for g, e in zip(got, expected))
        d = [abs(g - e) for g, e in zip(got, expected) if not np.isnan(e)]
        res[gemm] = {"pairs": len(items), "max_abs_delta_cp": max(d), "nan_where_expected": nan_ok}
    return res


def _cp_device_tokens(xp, width, seed=2):
    """GraphCP with tokens already in device memory (engine/device.py CupyDevice on a GPU,
    HostDevice in a dry run), as Scorer(device_resident=True) feeds it: packing on the device,
    only cp copied back. Against the numpy head on host copies."""
    from masc_engine.engine.device import CupyDevice, HostDevice
    from masc_engine.runtime.cp_device import CPItem, GraphCP
    from masc_engine.runtime.heads import masked_maxcos

    device = HostDevice() if xp is np else CupyDevice(0)
    rng = np.random.default_rng(seed)
    items, expected = [], []
    for ref, w, outs in _cp_cases(rng, width):
        ref_dev = device.from_host(ref)  # one device array per reference: one slot, read once per call
        for o in outs:
            items.append(CPItem(ref_dev, w, device.from_host(o)))
            expected.append(masked_maxcos(ref, o, w)[0])
    got = [
        c
        for c, _ in GraphCP(ArrayCPRunner(xp), max_outs_per_ref=4, max_refs_per_call=3, device=device).score_items(
            items
        )
    ]
    d = [abs(g - e) for g, e in zip(got, expected) if not np.isnan(e)]
    return {
        "device": device.name,
        "pairs": len(items),
        "max_abs_delta_cp": max(d),
        "nan_where_expected": all(np.isnan(g) == np.isnan(e) for g, e in zip(got, expected)),
    }


def section_cp_head_cupy(cfg, ctx):
    from masc_engine.runtime.heads import cp_forward
    from masc_engine.tolerances import CP_HEAD_ATOL

    cupy = _try_import("cupy")
    if cupy is None:
        if not cfg.dry_run:
            raise Skip("cupy is not importable")
        xp, sync = np, (lambda: None)
    else:
        try:
            cupy.cuda.runtime.getDeviceCount()
            xp, sync = cupy, (lambda: cupy.cuda.Stream.null.synchronize())
        except Exception as e:  # noqa: BLE001
            if not cfg.dry_run:
                raise Skip(f"cupy has no usable CUDA device: {e}") from e
            xp, sync = np, (lambda: None)
    out = {"xp": xp.__name__, "atol_fp32": CP_HEAD_ATOL}
    for width in sorted({64, cfg.cp_bench["d"]}):
        out[f"accuracy_d{width}"] = _cp_accuracy(lambda g: ArrayCPRunner(xp, g), width)
    out["fp32_within_atol"] = all(
        out[k]["float32"]["max_abs_delta_cp"] <= CP_HEAD_ATOL for k in out if k.startswith("accuracy_d")
    )
    out["device_tokens"] = _cp_device_tokens(xp, cfg.cp_bench["d"])
    # Timing at so400m shapes, tokens already on the device (the cached-reference case).
    b = cfg.cp_bench
    rng = np.random.default_rng(1)
    ref = xp.asarray(rng.normal(size=(1, b["n"], b["d"])).astype(np.float32))
    keep = xp.asarray(rng.random((1, b["n"])) > 0.4)
    outs = xp.asarray(rng.normal(size=(1, b["k"], b["m"], b["d"])).astype(np.float32))
    valid = xp.ones((1, b["k"], b["m"]), dtype=bool)
    timing = {}
    for gemm in ("float32", "float16"):
        cp_forward(ref, keep, outs, valid, xp=xp, gemm_dtype=gemm)
        sync()
        t = time.perf_counter()
        iters = 3 if cfg.dry_run else 10
        for _ in range(iters):
            cp_forward(ref, keep, outs, valid, xp=xp, gemm_dtype=gemm)
        sync()
        dt = (time.perf_counter() - t) / iters
        timing[gemm] = {"ms_per_call": dt * 1e3, "pairs_per_s": b["k"] / dt}
    out["timing_one_ref_vs_k_outputs"] = {"shape": b, **timing}
    return out


def section_cp_head_torch(cfg, ctx):
    torch = _try_import("torch")
    if torch is None:
        raise Skip("torch is not importable")
    dev = ctx["device"]
    from masc_engine.export.cp_head import MaskedMaxCosHead
    from masc_engine.tolerances import CP_HEAD_ATOL

    head = MaskedMaxCosHead().to(dev).eval()

    class TorchRunner:
        def __init__(self, gemm):
            self.gemm = gemm

        def run(self, feeds):
            t = {k: torch.from_numpy(np.ascontiguousarray(v)).to(dev) for k, v in feeds.items()}
            with torch.no_grad():
                if self.gemm == "float16" and dev.startswith("cuda"):
                    with torch.autocast("cuda", dtype=torch.float16):
                        r = head(t["ref_tokens"], t["ref_keep"], t["out_tokens"], t["out_valid"])
                elif self.gemm == "float16":
                    r = head(t["ref_tokens"], t["ref_keep"], t["out_tokens"], t["out_valid"])  # CPU: fp32 only
                else:
                    r = head(t["ref_tokens"], t["ref_keep"], t["out_tokens"], t["out_valid"])
            return {k: v.float().cpu().numpy() for k, v in zip(("cp", "best", "n_keep"), r)}

    out = {"device": dev, "atol_fp32": CP_HEAD_ATOL}
    prev_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        for width in sorted({64, cfg.cp_bench["d"]}):
            out[f"accuracy_d{width}"] = _cp_accuracy(TorchRunner, width)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev_tf32
    out["fp32_within_atol"] = all(
        out[k]["float32"]["max_abs_delta_cp"] <= CP_HEAD_ATOL for k in out if k.startswith("accuracy_d")
    )
    if not dev.startswith("cuda"):
        out["note"] = "CPU dry run: the float16 rows ran in fp32 (autocast fp16 is CUDA-only here)"
    return out


# ------------------------------------------------------------ the emulated SigLIP2 tower


def _build_tower(torch, spec, cfg, seed):
    """A SigLIP2-shaped NaFlex vision tower + attention-pooling head, random weights (std 0.02),
    with a ``policy`` dtype: GEMMs and the residual stream in that dtype; LayerNorm, softmax,
    tanh-GELU and the pooling softmax in fp32 (the TensorRT precision policy)."""
    nn, F = torch.nn, torch.nn.functional
    d, h, mlp, layers = spec["width"], spec["heads"], spec["mlp"], spec["layers"]
    pp3 = 3 * cfg.patch * cfg.patch
    mask_value = -30000.0

    def ln(mod, x):
        return F.layer_norm(x.float(), (d,), mod.weight.float(), mod.bias.float(), mod.eps).to(x.dtype)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d, eps=1e-6), nn.LayerNorm(d, eps=1e-6)
            self.qkv, self.o = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc1, self.fc2 = nn.Linear(d, mlp), nn.Linear(mlp, d)

        def forward(self, x, add_mask):
            b, n, _ = x.shape
            q, k, v = self.qkv(ln(self.ln1, x)).view(b, n, 3, h, d // h).permute(2, 0, 3, 1, 4)
            att = (q @ k.transpose(-1, -2)).float() * (d // h) ** -0.5 + add_mask
            att = torch.softmax(att, dim=-1).to(x.dtype)
            x = x + self.o((att @ v).transpose(1, 2).reshape(b, n, d))
            y = F.gelu(self.fc1(ln(self.ln2, x)).float(), approximate="tanh").to(x.dtype)
            return x + self.fc2(y)

    class Tower(nn.Module):
        def __init__(self):
            super().__init__()
            self.patch = nn.Linear(pp3, d)
            self.pos = nn.Parameter(torch.zeros(cfg.pos_grid * cfg.pos_grid, d))
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.post_ln = nn.LayerNorm(d, eps=1e-6)
            self.probe = nn.Parameter(torch.zeros(1, 1, d))
            self.pool_qkv, self.pool_o = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.pool_ln = nn.LayerNorm(d, eps=1e-6)
            self.pool_fc1, self.pool_fc2 = nn.Linear(d, mlp), nn.Linear(mlp, d)

        def pos_for(self, grid, n_pad):
            g = cfg.pos_grid
            table = self.pos.float().view(1, g, g, d).permute(0, 3, 1, 2)
            p = F.interpolate(table, size=grid, mode="bilinear", align_corners=False, antialias=True)
            p = p.permute(0, 2, 3, 1).reshape(grid[0] * grid[1], d)
            return F.pad(p, (0, 0, 0, n_pad - p.shape[0]))

        def encode(self, pixels, valid, grids):
            """pixels [B, N, pp3] f32, valid [B, N] bool -> tokens [B, N, D] f32."""
            dt = self.patch.weight.dtype
            n = pixels.shape[1]
            pos = torch.stack([self.pos_for(g, n) for g in grids]).to(dt)
            x = self.patch(pixels.to(dt)) + pos
            add_mask = (~valid)[:, None, None, :].float() * mask_value
            for blk in self.blocks:
                x = blk(x, add_mask)
            return ln(self.post_ln, x).float()

        def pool(self, tokens, kpm):
            """tokens [B, N, D] f32, kpm [B, N] bool (True = hidden) -> pooled [B, D] f32."""
            dt = self.patch.weight.dtype
            x = tokens.to(dt)
            b, n, _ = x.shape
            wq, wk, wv = self.pool_qkv.weight.chunk(3, 0)
            bq, bk, bv = self.pool_qkv.bias.chunk(3, 0)
            hd = d // h
            q = (self.probe @ wq.T + bq).view(1, 1, h, hd).transpose(1, 2)
            k = (x @ wk.T + bk).view(b, n, h, hd).transpose(1, 2)
            v = (x @ wv.T + bv).view(b, n, h, hd).transpose(1, 2)
            logits = (q @ k.transpose(-1, -2)).float() * hd**-0.5 + kpm[:, None, None, :].float() * mask_value
            w = torch.softmax(logits, dim=-1).to(dt)
            o = self.pool_o((w @ v).transpose(1, 2).reshape(b, 1, d))
            y = F.gelu(self.pool_fc1(ln(self.pool_ln, o)).float(), approximate="tanh").to(dt)
            return (o + self.pool_fc2(y))[:, 0].float()

    torch.manual_seed(seed)
    tower = Tower()
    with torch.no_grad():
        for name, p in tower.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            elif ".ln" in name or "_ln" in name or "post_ln" in name:
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02)
    return tower.eval()


def _synthetic_images(cfg, rng):
    """(pixels [N_i, 3*p*p] in [-1, 1], grid) per image: scenes, all-white, all-black, noise,
    checkerboards, on NaFlex-like grids."""
    p = cfg.patch
    kinds = ["scene", "scene", "scene", "white", "black", "noise", "checker", "scene"]
    images = []
    for i in range(cfg.n_images):
        grid = cfg.grid_choices[i % len(cfg.grid_choices)]
        hh, ww = grid[0] * p, grid[1] * p
        kind = kinds[i % len(kinds)]
        if kind == "white":
            img = np.ones((hh, ww, 3))
        elif kind == "black":
            img = -np.ones((hh, ww, 3))
        elif kind == "noise":
            img = rng.uniform(-1, 1, (hh, ww, 3))
        elif kind == "checker":
            s = int(rng.integers(3, 24))
            yy, xx = np.mgrid[0:hh, 0:ww]
            img = np.repeat((((yy // s + xx // s) % 2) * 2.0 - 1.0)[..., None], 3, axis=2)
        else:
            yy, xx = np.mgrid[0:hh, 0:ww] / max(hh, ww)
            img = (
                np.stack(
                    [
                        np.sin(xx * rng.uniform(1, 9) + rng.uniform(0, 6)),
                        np.cos(yy * rng.uniform(1, 9) + rng.uniform(0, 6)),
                        np.sin((xx + yy) * rng.uniform(1, 9)),
                    ],
                    axis=-1,
                )
                * 0.6
            )
            for _ in range(int(rng.integers(2, 6))):
                cy, cx, r = rng.uniform(0, hh), rng.uniform(0, ww), rng.uniform(0.1, 0.4) * min(hh, ww)
                m = ((np.mgrid[0:hh, 0:ww][0] - cy) ** 2 + (np.mgrid[0:hh, 0:ww][1] - cx) ** 2) < r * r
                img[m] = rng.uniform(-1, 1, 3)
            img = np.clip(img + rng.normal(0, 0.05, img.shape), -1, 1)
        patches = img.reshape(grid[0], p, grid[1], p, 3).transpose(0, 2, 1, 3, 4).reshape(grid[0] * grid[1], -1)
        images.append((patches.astype(np.float32), grid, kind))
    return images


def _masks(cfg, images, rng):
    """Reference weights (soft ellipses; one keeps nothing) and output weights (ellipses; some
    leave 1-3 background patches; one hides everything) on each image's patch grid."""
    ref_w, out_w = [], []
    for i, (_, grid, _) in enumerate(images):
        gy, gx = np.mgrid[0 : grid[0], 0 : grid[1]]
        cy, cx = rng.uniform(0.3, 0.7) * grid[0], rng.uniform(0.3, 0.7) * grid[1]
        ry, rx = rng.uniform(0.2, 0.45) * grid[0] + 0.5, rng.uniform(0.2, 0.45) * grid[1] + 0.5
        dist = np.sqrt(((gy - cy) / ry) ** 2 + ((gx - cx) / rx) ** 2)
        soft = np.clip(1.5 - dist, 0, 1).astype(np.float32).ravel()
        ref_w.append(np.zeros_like(soft) if i == 1 else soft)
        ow = soft.copy()
        if i % 5 == 2:  # few background patches left
            ow = np.ones_like(soft)
            ow[rng.choice(ow.size, size=int(rng.integers(1, 4)), replace=False)] = 0.0
        if i == 3:  # no background at all: PF undefined (NaN in both precisions)
            ow = np.ones_like(soft)
        out_w.append(ow)
    return ref_w, out_w


def _encode_all(torch, tower, images, cfg, dev, batch):
    toks = []
    for s in range(0, len(images), batch):
        chunk = images[s : s + batch]
        n = max(x[0].shape[0] for x in chunk)
        px = np.zeros((len(chunk), n, chunk[0][0].shape[1]), np.float32)
        valid = np.zeros((len(chunk), n), bool)
        for j, (p, _, _) in enumerate(chunk):
            px[j, : p.shape[0]] = p
            valid[j, : p.shape[0]] = True
        with torch.no_grad():
            t = tower.encode(torch.from_numpy(px).to(dev), torch.from_numpy(valid).to(dev), [c[1] for c in chunk])
        for j, (p, _, _) in enumerate(chunk):
            toks.append(t[j, : p.shape[0]])
    return toks


def _pool_all(torch, tower, toks, out_w, dev):
    from masc_engine.runtime.masks import foreground

    pooled = []
    for t, w in zip(toks, out_w):
        kpm = torch.from_numpy(foreground(w)).to(dev)
        if bool(kpm.all()):
            pooled.append(torch.full((t.shape[1],), float("nan"), device=dev))
            continue
        with torch.no_grad():
            pooled.append(tower.pool(t[None], kpm[None])[0])
    return torch.stack(pooled)


def _cp_matrix(torch, toks, ref_w, gemm_dtype):
    """CP for every (reference i, output j != i): the cp graph's computation with R = 1, K = all
    outputs, in torch on the tokens' device. Returns [I, J] float64 (NaN on the diagonal and for
    a reference keeping nothing)."""
    from masc_engine.runtime.heads import INVALID_FILL, NORMALIZE_EPS
    from masc_engine.runtime.masks import cp_keep

    n_img = len(toks)
    dev = toks[0].device
    d = toks[0].shape[1]
    m = max(t.shape[0] for t in toks)
    outs = torch.zeros(n_img, m, d, device=dev)
    valid = torch.zeros(n_img, m, dtype=torch.bool, device=dev)
    for j, t in enumerate(toks):
        outs[j, : t.shape[0]] = t
        valid[j, : t.shape[0]] = True
    outs_n = outs / outs.norm(dim=-1, keepdim=True).clamp_min(NORMALIZE_EPS)
    res = np.full((n_img, n_img), np.nan)
    for i, t in enumerate(toks):
        keep = torch.from_numpy(cp_keep(ref_w[i])).to(dev)
        if not bool(keep.any()):
            continue
        r = t[keep]
        rn = r / r.norm(dim=-1, keepdim=True).clamp_min(NORMALIZE_EPS)
        sims = (rn.to(gemm_dtype) @ outs_n.reshape(-1, d).to(gemm_dtype).T).float().view(-1, n_img, m)
        sims = torch.where(valid[None], sims, torch.full_like(sims, INVALID_FILL))
        cp = sims.amax(-1).mean(0).double().cpu().numpy()
        res[i] = cp
    np.fill_diagonal(res, np.nan)
    return res


def _fidelity_for_model(torch, cfg, ctx, name, spec):
    fg = _fidelity_module()
    dev = ctx["device"]
    rng = np.random.default_rng(7)
    images = _synthetic_images(cfg, rng)
    ref_w, out_w = _masks(cfg, images, rng)
    pairs = [(i, j) for i in range(len(images)) for j in range(len(images)) if i != j]
    tower32 = _build_tower(torch, spec, cfg, seed=0).to(dev)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    batch = 4 if cfg.dry_run else 8
    results = {
        "pairs": len(pairs),
        "images": len(images),
        "image_kinds": sorted({k for _, _, k in images}),
        "grids": sorted({tuple(g) for _, g, _ in images}),
    }

    def scores(tower, gemm_dtype):
        t0 = time.perf_counter()
        toks = _encode_all(torch, tower, images, cfg, dev, batch)
        pooled = _pool_all(torch, tower, toks, out_w, dev)
        cpm = _cp_matrix(torch, toks, ref_w, gemm_dtype)
        return toks, pooled, cpm, time.perf_counter() - t0

    toks32, pooled32, cp32, secs = scores(tower32, torch.float32)
    results["fp32_seconds"] = secs
    # "Text" embeddings: mixtures of pooled image embeddings plus noise, so PF spans a realistic
    # range instead of sitting near 0 as it would for random directions.
    finite = pooled32[torch.isfinite(pooled32).all(dim=1)]
    g = torch.Generator(device="cpu").manual_seed(3)
    mix = torch.rand(10, finite.shape[0], generator=g).to(dev)
    text = mix @ finite + 0.5 * finite.norm(dim=1).mean() * torch.randn(10, finite.shape[1], generator=g).to(dev)
    text = text / text.norm(dim=1, keepdim=True)

    def pf_of(pooled):
        pn = pooled / pooled.norm(dim=1, keepdim=True)
        sims = (pn @ text.T).double().cpu().numpy()  # [images, prompts]
        return np.array([sims[j, (i + j) % 10] for i, j in pairs])

    def pack(pooled, cpm):
        return {
            "cp": np.array([cpm[i, j] for i, j in pairs]),
            "pf": pf_of(pooled),
            "embeddings": pooled.double().cpu().numpy(),
        }

    ref = pack(pooled32, cp32)
    results["fp32_score_spread"] = {
        "cp_std": float(np.nanstd(ref["cp"])),
        "pf_std": float(np.nanstd(ref["pf"])),
        "cp_range": [float(np.nanmin(ref["cp"])), float(np.nanmax(ref["cp"]))],
        "pf_range": [float(np.nanmin(ref["pf"])), float(np.nanmax(ref["pf"]))],
        "nan_cp": int(np.isnan(ref["cp"]).sum()),
        "nan_pf": int(np.isnan(ref["pf"]).sum()),
    }
    precisions = [("fp16", torch.float16)]
    if not dev.startswith("cuda") or torch.cuda.is_bf16_supported():
        precisions.append(("bf16", torch.bfloat16))
    for pname, pdt in precisions:
        try:  # one precision's failure keeps the other's results (recorded next to them)
            results[pname] = _fidelity_one_precision(
                torch, spec, cfg, dev, pdt, pname, scores, toks32, ref_w, images, ref, pack, fg
            )
        except Exception as e:  # noqa: BLE001
            results[pname] = {
                "status": "error",
                "error": f"{type(e).__name__}: {e}",
                "traceback": traceback.format_exc(),
            }
    if dev.startswith("cuda"):
        torch.cuda.empty_cache()
    return results


def _fidelity_one_precision(torch, spec, cfg, dev, pdt, pname, scores, toks32, ref_w, images, ref, pack, fg):
    """One reduced precision of :func:`_fidelity_for_model` (its results, or the caller records the error)."""
    tower = _build_tower(torch, spec, cfg, seed=0).to(dev).to(pdt)
    toks, pooled, cp_f32gemm, secs = scores(tower, torch.float32)
    cp_lowgemm = _cp_matrix(torch, toks, ref_w, pdt)
    token_cos = torch.cat([torch.nn.functional.cosine_similarity(a, b, dim=-1) for a, b in zip(toks32, toks)])
    nonfinite_tokens = int(sum((~torch.isfinite(t)).sum().item() for t in toks))
    per_kind = {}
    for kind in sorted({k for _, _, k in images}):
        sel = [idx for idx, (_, _, k) in enumerate(images) if k == kind]
        c = torch.cat([torch.nn.functional.cosine_similarity(toks32[s], toks[s], dim=-1) for s in sel])
        per_kind[kind] = float(c.min())
    out = {
        "seconds": secs,
        "nonfinite_tokens": nonfinite_tokens,
        "token_cosine_min": float(token_cos.min()),
        "token_cosine_mean": float(token_cos.mean()),
        "token_cosine_min_by_image_kind": per_kind,
        "gates_cp_gemm_fp32": fg.fidelity_gates(ref, pack(pooled, cp_f32gemm)),
        f"gates_cp_gemm_{pname}": fg.fidelity_gates(ref, pack(pooled, cp_lowgemm)),
    }
    del tower
    return out


def section_throughput(cfg, ctx):
    torch = _try_import("torch")
    if torch is None:
        raise Skip("torch is not importable")
    dev = ctx["device"]
    name, spec = list(cfg.models.items())[-1]
    b, n = cfg.tp_batch, cfg.budget
    side = int(math.isqrt(n))
    out = {
        "model": name,
        "batch": b,
        "patches": n,
        "device": dev,
        "what": "PyTorch eager, random weights, SigLIP2-shaped vision tower (not a TensorRT engine)",
    }
    px = torch.randn(b, n, 3 * cfg.patch * cfg.patch, device=dev).clamp(-1, 1)
    valid = torch.ones(b, n, dtype=torch.bool, device=dev)
    grids = [(side, n // side)] * b

    def sync():
        if dev.startswith("cuda"):
            torch.cuda.synchronize()

    for label, dt, tf32 in [
        ("fp32", torch.float32, False),
        ("tf32", torch.float32, True),
        ("fp16_policy", torch.float16, False),
    ]:
        if not dev.startswith("cuda") and label != "fp32":
            continue
        torch.backends.cuda.matmul.allow_tf32 = tf32
        tower = _build_tower(torch, spec, cfg, seed=0).to(dev).to(dt)
        with torch.no_grad():
            tower.encode(px, valid, grids)
            sync()
            t = time.perf_counter()
            for _ in range(cfg.tp_iters):
                tower.encode(px, valid, grids)
            sync()
        dt_s = (time.perf_counter() - t) / cfg.tp_iters
        out[label] = {"images_per_s": b / dt_s, "ms_per_batch": dt_s * 1e3}
        if dev.startswith("cuda"):
            out[label]["peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
            torch.cuda.reset_peak_memory_stats()
        del tower
    torch.backends.cuda.matmul.allow_tf32 = False
    return out


def section_ort_cuda(cfg, ctx):
    ort = _try_import("onnxruntime")
    if ort is None:
        raise Skip("onnxruntime is not importable (onnxruntime-gpu is needed for the CUDA EP)")
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        raise Skip(
            f"onnxruntime {ort.__version__} has no CUDAExecutionProvider "
            f"(providers: {ort.get_available_providers()}); install onnxruntime-gpu"
        )
    if _try_import("onnxscript") is None or _try_import("torch") is None:
        raise Skip("exporting cp.onnx here needs torch + onnxscript")
    import tempfile

    from masc_engine.engine.backends.onnxruntime import OrtRunner
    from masc_engine.export.cp_head import cp_spec
    from masc_engine.export.graphs import export_graph
    from masc_engine.tolerances import CP_HEAD_ATOL

    width = cfg.cp_bench["d"]
    with tempfile.TemporaryDirectory() as d:
        export_graph(cp_spec(width), Path(d) / "cp.onnx")
        acc = _cp_accuracy(lambda g: OrtRunner(Path(d) / "cp.onnx", "cp", provider="cuda"), width)
    out = {
        "provider": "CUDAExecutionProvider",
        "accuracy": acc["float32"],
        "within_atol": acc["float32"]["max_abs_delta_cp"] <= CP_HEAD_ATOL,
    }
    for key, step in (("device_resident_scorer", _ort_cuda_device_resident), ("fp16_bundle", _ort_cuda_fp16_bundle)):
        try:  # each step's result (or error) is kept next to the others
            out[key] = step()
        except Skip as e:
            out[key] = {"status": "skipped", "reason": str(e)}
        except Exception as e:  # noqa: BLE001
            out[key] = {"status": "error", "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
    return out


def _ort_cuda_fp16_bundle():
    """The fp16 bundle's mixed-precision graphs on ORT CUDA (the export gates, on a GPU): against the same
    graphs on ORT CPU and against the fp32 bundle on CUDA (``use_tf32`` off), with the export
    gates' per-pair bound. UNVERIFIED until run on a GPU."""
    for mod in ("transformers", "tokenizers", "PIL"):
        if _try_import(mod) is None:
            raise Skip(f"{mod} is not importable")
    import tempfile

    from masc_engine.export.exporter import export_bundle
    from masc_engine.export.validate import validation_pairs
    from masc_engine.runtime.scorer import Scorer
    from masc_engine.tolerances import FIDELITY_MAX_ABS_DELTA

    pairs = validation_pairs(8)
    with tempfile.TemporaryDirectory() as d:
        b32 = export_bundle("random:tiny-naflex", Path(d) / "b32")
        b16 = export_bundle("random:tiny-naflex", Path(d) / "b16", precision="fp16")
        cuda16 = Scorer(b16, provider="cuda").score_batch(pairs)
        cpu16 = Scorer(b16).score_batch(pairs)
        cuda32 = Scorer(b32, provider="cuda").score_batch(pairs)
    d = lambda a, b, k: max(abs(getattr(x, k) - getattr(y, k)) for x, y in zip(a, b))  # noqa: E731
    res = {
        "pairs": len(pairs),
        "cuda_fp16_vs_cpu_fp16": {"max_abs_dcp": d(cuda16, cpu16, "cp"), "max_abs_dpf": d(cuda16, cpu16, "pf")},
        "cuda_fp16_vs_cuda_fp32": {"max_abs_dcp": d(cuda16, cuda32, "cp"), "max_abs_dpf": d(cuda16, cuda32, "pf")},
        "gate": FIDELITY_MAX_ABS_DELTA,
    }
    res["passes"] = max(res["cuda_fp16_vs_cuda_fp32"].values()) <= FIDELITY_MAX_ABS_DELTA
    return res


def _ort_cuda_device_resident():
    """Scorer(provider="cuda", device_resident=True) (IO binding on CuPy memory, the whole
    pipeline) against the CPU host path with the same cp graph, on a tiny random bundle."""
    for mod in ("cupy", "transformers", "tokenizers", "PIL"):
        if _try_import(mod) is None:
            raise Skip(f"{mod} is not importable")
    import tempfile

    from masc_engine.export.exporter import export_bundle
    from masc_engine.runtime.scorer import Pair, Scorer
    from PIL import Image

    rng = np.random.default_rng(3)
    imgs = [
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8))
        for h, w in [(256, 256), (192, 320), (320, 192), (128, 128), (256, 256), (96, 400)]
    ]
    masks = []
    for im in imgs:
        m = np.zeros((im.height, im.width), np.uint8)
        m[im.height // 4 : 3 * im.height // 4, im.width // 4 : 3 * im.width // 4] = 255
        masks.append(m)
    pairs = [
        Pair(imgs[r], masks[r], imgs[o], masks[o], "a photo of a dog on the beach", "dog")
        for r in (0, 1)
        for o in range(2, 6)
    ]
    with tempfile.TemporaryDirectory() as d:
        bundle = export_bundle("random:tiny-naflex", Path(d) / "b")
        gpu = Scorer(bundle, provider="cuda", device_resident=True, batch_size=3).score_batch(pairs)
        cpu = Scorer(bundle, cp_head="graph", batch_size=3).score_batch(pairs)
    d_cp = max(abs(g.cp - c.cp) for g, c in zip(gpu, cpu))
    d_pf = max(abs(g.pf - c.pf) for g, c in zip(gpu, cpu))
    return {
        "pairs": len(pairs),
        "max_abs_delta_cp_vs_cpu": d_cp,
        "max_abs_delta_pf_vs_cpu": d_pf,
        "what": "tiny random NaFlex bundle; CUDA EP with tokens in CuPy memory vs ORT CPU",
    }


def section_tensorrt(cfg, ctx):
    if _try_import("tensorrt") is None:
        raise Skip("tensorrt is not importable on this machine")
    if _try_import("onnxscript") is None or _try_import("torch") is None:
        raise Skip("exporting cp.onnx here needs torch + onnxscript")
    import tempfile

    from masc_engine.engine.backends import trt_profiles as tp
    from masc_engine.engine.backends.tensorrt import TrtRunner, build_engine
    from masc_engine.export.cp_head import cp_spec
    from masc_engine.export.graphs import export_graph
    from masc_engine.export.precision import PrecisionTransform

    width = cfg.cp_bench["d"]
    spec = cp_spec(width)
    entry = spec.manifest_entry()
    ranges = tp.default_axis_ranges({"image": {"max_num_patches": cfg.budget}}, max_batch=4, max_outs_per_ref=8)
    shapes = tp.profile_shapes(entry, ranges)
    out = {}
    with tempfile.TemporaryDirectory() as d:
        export_graph(spec, Path(d) / "cp.onnx")
        # Strongly typed engines: the fp16 engine is built from the fp16 graph (export/precision.py).
        PrecisionTransform("fp16").apply("cp", Path(d) / "cp.onnx", Path(d) / "cp.fp16.onnx")
        for prec, graph in (("fp32", "cp.onnx"), ("fp16", "cp.fp16.onnx")):
            try:  # one precision's failure keeps the other's results
                facts = build_engine(
                    Path(d) / graph,
                    Path(d) / f"cp.{prec}.engine",
                    prec,
                    [shapes],
                    timing_cache=Path(d) / "timing.cache",
                    graph="cp",
                )
                acc = _cp_accuracy(lambda g: TrtRunner(Path(d) / f"cp.{prec}.engine", "cp", entry, shapes), width)
                stub = {"precision": {"graphs": ["cp"] if prec == "fp16" else []}}
                paper = tp.activation_bytes("cp", stub, {k: v["max"] for k, v in shapes.items()}, prec)
                out[prec] = {
                    "status": "ok",
                    "build": facts,
                    "accuracy": acc["float32"],
                    "activation_bytes_on_paper": paper,
                    "measured_over_paper": facts["device_memory_bytes"][0] / paper,
                    "context_memory": _context_memory_follows(
                        TrtRunner, Path(d) / f"cp.{prec}.engine", entry, shapes, facts
                    ),
                    "cuda_graphs": _graph_replay_equals_plain(TrtRunner, Path(d) / f"cp.{prec}.engine", entry, shapes),
                }
            except Exception as e:  # noqa: BLE001 - recorded next to the other precision's results
                out[prec] = {
                    "status": "error",
                    "error": f"{type(e).__name__}: {e}",
                    "traceback": traceback.format_exc(),
                }
    return out


def _context_memory_follows(runner_cls, engine, entry, shapes, facts) -> dict:
    """One call at the profile's smallest shapes: the context memory the runner then holds against
    TensorRT's profile-maximum figure (with RUNTIME_ACTIVATION_RESIZE_10_10 it should be far below)."""
    r = runner_cls(engine, "cp", entry, shapes)
    feeds = {k: np.ones(shapes[k]["min"], r._dtypes[k]) for k in r.input_names}
    r.run(feeds)
    held, top = r.device_memory_bytes, facts["device_memory_bytes"][0]
    r.close()
    return {
        "activation_resize": facts.get("activation_resize"),
        "held_at_min_shapes": held,
        "profile_max": top,
        "shape_following_at_build": facts.get("shape_following_bytes"),
        "follows_shapes": held < top,
    }


def section_fp8_qdq(cfg, ctx):
    """Whether TensorRT's strongly typed builder takes export/fp8.py's E4M3 Q/DQ around a MatMul
    (the build's facts; ONNX Runtime CPU's output norm on the same graph for a later comparison)."""
    if _try_import("tensorrt") is None:
        raise Skip("tensorrt is not importable on this machine")
    import tempfile

    import onnx
    import onnxruntime as ort
    from onnx import helper, numpy_helper

    from masc_engine.export import fp8

    rng = np.random.default_rng(0)
    w = rng.normal(size=(256, 512)).astype(np.float32) / 16
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="linear")],
        "fp8",
        [helper.make_tensor_value_info("x", 1, ["batch", 256])],
        [helper.make_tensor_value_info("y", 1, ["batch", 512])],
        [numpy_helper.from_array(w, "w")],
    )
    model = fp8.qdq_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]), {"x": 4.0}, graph="g")
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "fp8.onnx"
        onnx.save(model, str(path))
        from masc_engine.engine.backends.tensorrt import build_engine

        shapes = {"x": {"min": [1, 256], "opt": [64, 256], "max": [256, 256]}}
        facts = build_engine(path, Path(d) / "fp8.engine", "fp8", [shapes], graph="fp8")
        x = rng.uniform(-4, 4, (64, 256)).astype(np.float32)
        ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    return {
        "build": facts,
        "ort_cpu_output_norm": float(np.linalg.norm(ref)),
        "note": "engine output against ONNX Runtime: run it through TrtRunner once a GPU is at hand",
    }


#: Weights of the SigLIP2 so400m towers (patch16, NaFlex), from the architecture: 27 layers of width
#: 1152 with MLP 4304 per tower, the vision patch and position embeddings, the text tower's 256k x
#: 1152 token embedding (Gemma tokenizer), the pooling head (one attention block and its MLP).
SO400M = {
    "width": 1152,
    "layers": 27,
    "heads": 16,
    "mlp": 4304,
    "vocab": 256_000,
    "patch": 16,
    "pos": 256,
    "text_len": 64,
}


def _so400m_params() -> dict:
    a = SO400M
    layer = 4 * a["width"] ** 2 + 2 * a["width"] * a["mlp"] + 9 * a["width"] + a["mlp"]
    vision = a["layers"] * layer + 3 * a["patch"] ** 2 * a["width"] + a["pos"] * a["width"]
    text = a["layers"] * layer + a["vocab"] * a["width"] + a["text_len"] * a["width"] + a["width"] ** 2
    pool = layer + a["width"]
    return {"vision": vision, "text": text, "pool": pool, "cp": 0}


def so400m_manifest(precision: str, budget: int = 1024) -> dict:
    """The manifest fields the memory plan reads, for an so400m bundle."""
    a = SO400M
    reduced = {"fp16": ["vision", "pool", "text", "cp"], "bf16": ["vision", "pool", "text"]}.get(precision, [])
    d = a["width"]
    return {
        "architecture": {"vision_width": d, "text_projection": d, "pool_heads": a["heads"], "vision_layers": 27},
        "image": {"max_num_patches": budget, "patch_size": 16},
        "precision": {"mode": precision, "graphs": reduced},
        "graphs": {
            "vision": {
                "inputs": [
                    {"name": "pixel_values", "dtype": "float32", "shape": ["batch", "num_patches", 768]},
                    {"name": "pixel_attention_mask", "dtype": "int32", "shape": ["batch", "num_patches"]},
                    {"name": "position_weights", "dtype": "float32", "shape": ["batch", "num_patches", 256]},
                ],
                "outputs": [{"name": "last_hidden_state", "dtype": "float32", "shape": ["batch", "num_patches", d]}],
            },
            "pool": {
                "inputs": [
                    {"name": "hidden", "dtype": "float32", "shape": ["batch", "num_tokens", d]},
                    {"name": "key_padding_mask", "dtype": "bool", "shape": ["batch", "num_tokens"]},
                ],
                "outputs": [
                    {"name": "pooled", "dtype": "float32", "shape": ["batch", d]},
                    {"name": "attention", "dtype": "float32", "shape": ["batch", "num_tokens"]},
                ],
            },
            "text": {
                "inputs": [{"name": "input_ids", "dtype": "int64", "shape": ["batch", 64]}],
                "outputs": [{"name": "text_embeds", "dtype": "float32", "shape": ["batch", d]}],
            },
            "cp": {
                "inputs": [
                    {"name": "ref_tokens", "dtype": "float32", "shape": ["refs", "ref_patches", d]},
                    {"name": "ref_keep", "dtype": "bool", "shape": ["refs", "ref_patches"]},
                    {"name": "out_tokens", "dtype": "float32", "shape": ["refs", "outs_per_ref", "out_patches", d]},
                    {"name": "out_valid", "dtype": "bool", "shape": ["refs", "outs_per_ref", "out_patches"]},
                ],
                "outputs": [
                    {"name": "cp", "dtype": "float32", "shape": ["refs", "outs_per_ref"]},
                    {"name": "best", "dtype": "float32", "shape": ["refs", "outs_per_ref", "ref_patches"]},
                ],
            },
        },
    }


def _gpu_free_bytes():
    cupy = _try_import("cupy")
    try:
        free, total = cupy.cuda.runtime.memGetInfo()
        return int(free), int(total)
    except Exception:  # noqa: BLE001 - no CuPy or no GPU
        return None


def section_memory_plan(cfg, ctx):
    from masc_engine.engine.backends import trt_profiles as tp

    gib = float(tp.GIB)
    params = _so400m_params()
    run_shapes = {
        "vision": {
            "pixel_values": [8, 1024, 768],
            "pixel_attention_mask": [8, 1024],
            "position_weights": [8, 1024, 256],
        },
        "pool": {"hidden": [8, 1024, 1152], "key_padding_mask": [8, 1024]},
        "text": {"input_ids": [8, 64]},
        # runtime/cp_device.py DEFAULT_MAX_SIMS: R * K * N * M <= 2**26 per call
        "cp": {
            "ref_tokens": [4, 1024, 1152],
            "ref_keep": [4, 1024],
            "out_tokens": [4, 16, 1024, 1152],
            "out_valid": [4, 16, 1024],
        },
    }
    out = {
        "what": "on paper: trt_profiles.memory_plan (weights from the so400m architecture, activations from "
        "the layer model in trt_profiles.activation_bytes); unverified on a GPU",
        "gpus": {"RTX 3090 (the paper's)": 24.0, "H200": 141.0},
        "params": params,
    }
    free = _gpu_free_bytes()
    if free:
        out["this_gpu_free_gib"], out["this_gpu_total_gib"] = round(free[0] / gib, 2), round(free[1] / gib, 2)
    for precision in ("fp16", "fp32"):
        m = so400m_manifest(precision)
        e = tp.FLOAT_BYTES[precision]
        weights = {g: n * (e if g in m["precision"]["graphs"] or precision == "fp32" else 4) for g, n in params.items()}
        ranges = tp.default_axis_ranges(m, max_batch=16, max_outs_per_ref=16)
        plan = tp.memory_plan(m, precision, ranges, weights)
        run = {
            g: {
                "activation_gib": round(tp.activation_bytes(g, m, s, precision) / gib, 3),
                "io_gib": round(tp.io_bytes(m["graphs"][g], s) / gib, 3),
            }
            for g, s in run_shapes.items()
        }
        run_total = sum(weights.values()) + sum(
            tp.activation_bytes(g, m, s, precision) + tp.io_bytes(m["graphs"][g], s) for g, s in run_shapes.items()
        )
        out[precision] = {
            "weights_gib": {g: round(w / gib, 3) for g, w in weights.items()},
            "profile_max": {
                g: {
                    "activation_gib": round(v["profile_max"]["activation_bytes"] / gib, 3),
                    "io_gib": round(v["profile_max"]["io_bytes"] / gib, 3),
                }
                for g, v in plan["engines"].items()
            },
            "static_contexts_total_gib": round(plan["total_bytes"] / gib, 2),
            "scorer_defaults": run,
            "user_managed_total_gib": round(run_total / gib, 2),
            "fits": {
                name: {
                    "static": plan["total_bytes"] / gib <= size * tp.BUDGET_HEADROOM,
                    "user_managed": run_total / gib <= size * tp.BUDGET_HEADROOM,
                }
                for name, size in out["gpus"].items()
            },
        }
        # bench/gpu_throughput.py before: vision profiles to batch 64, a Scorer per batch size (1, 8, 16,
        # 32, 64), each with static contexts, freed only by a cycle-collector pass
        plan64 = tp.memory_plan(m, precision, tp.default_axis_ranges(m, max_batch=64, max_outs_per_ref=16), weights)
        out[precision]["batch64_static_total_gib"] = round(plan64["total_bytes"] / gib, 2)
        out[precision]["batch64_five_scorers_static_gib"] = round(5 * plan64["total_bytes"] / gib, 2)
        for name, size in out["gpus"].items():
            _, chosen = tp.choose_ranges(m, precision, weights, int(size * gib), 64, 16)
            out[precision]["fits"][name]["max_batch_chosen_when_64_asked"] = chosen["max_batch"]
    return out


def _graph_replay_equals_plain(runner_cls, engine, entry, shapes) -> dict:
    """Shape sets min, max, min, max, min through a runner with CUDA graphs and one without: the
    replayed graphs' outputs against the plain enqueues' (bit for bit), and the captures counted."""
    rng = np.random.default_rng(7)
    graphs = runner_cls(engine, "cp", entry, shapes, cuda_graphs=True)
    plain = runner_cls(engine, "cp", entry, shapes, cuda_graphs=False)
    diffs = []
    for end in ("min", "max", "min", "max", "min"):
        feeds = {  # random floats; masks and other inputs all ones, as _context_memory_follows
            k: rng.uniform(-1, 1, shapes[k][end]).astype(t) if t.kind == "f" else np.ones(shapes[k][end], t)
            for k, t in ((k, graphs._dtypes[k]) for k in graphs.input_names)
        }
        a, b = graphs.run(feeds), plain.run(feeds)
        diffs += [float(np.max(np.abs(a[k].astype(np.float64) - b[k]), initial=0.0)) for k in a]
    res = {
        "captures": graphs.graph_captures,
        "replays": graphs.graph_replays,
        "graphs_on": graphs.cuda_graphs,
        "max_abs_diff": max(diffs),
        "bit_identical": max(diffs) == 0.0,
    }
    graphs.close()
    plain.close()
    return res


def section_pipeline(cfg, ctx):
    from masc_engine.engine.device import overlapped

    out = {}
    # the double-buffered loop itself: host work (prepare) overlapping "device" work (run)
    prep_s, run_s, n = (0.02, 0.02, 6) if cfg.dry_run else (0.01, 0.01, 10)
    t = time.perf_counter()
    serial = [(time.sleep(run_s), b)[1] for b in [(time.sleep(prep_s), i)[1] for i in range(n)]]
    t_serial = time.perf_counter() - t
    t = time.perf_counter()
    over = overlapped(range(n), lambda i: (time.sleep(prep_s), i)[1], lambda b: (time.sleep(run_s), b)[1])
    out["loop"] = {
        "serial_s": t_serial,
        "overlapped_s": time.perf_counter() - t,
        "same_results": serial == over,
        "what": "sleep-based host and device work",
    }
    out["loop"]["ratio"] = out["loop"]["overlapped_s"] / t_serial
    cupy = _try_import("cupy")
    if cupy is None or cfg.dry_run or _gpu_free_bytes() is None:
        out["copies"] = {"status": "skipped", "reason": "needs CuPy and a CUDA GPU"}
        return out
    out["copies"] = _copy_overlap(cupy)
    return out


def _copy_overlap(cupy):
    """Pinned vs pageable H2D bandwidth (CUDA events on the copy stream), and a 256 MiB H2D copy from
    pinned memory on one stream beside four fp16 8192^2 GEMMs on another: ``overlaps`` when doing
    both takes clearly less than the two apart."""
    from masc_engine.engine.device import CupyDevice

    dev = CupyDevice(0)
    nbytes = 256 << 20
    pageable = np.ones(nbytes // 4, np.float32)
    pinned = dev.pinned_empty(pageable.shape, np.float32)
    pinned[...] = 1
    dst = cupy.empty(pageable.shape, cupy.float32)
    s_copy, s_gemm = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
    a = cupy.random.standard_normal((8192, 8192), dtype=cupy.float32).astype(cupy.float16)
    res = {}
    for label, host in (("pageable", pageable), ("pinned", pinned)):
        dev.copy_to_device(host, dst, s_copy)  # warm-up
        s_copy.synchronize()
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record(s_copy)
        dev.copy_to_device(host, dst, s_copy)
        end.record(s_copy)
        end.synchronize()
        res[f"{label}_h2d_gb_per_s"] = nbytes / (cupy.cuda.get_elapsed_time(start, end) / 1e3) / 1e9

    def gemms():
        with s_gemm:
            for _ in range(4):
                a @ a

    def wall(*steps):
        t = time.perf_counter()
        for step in steps:
            step()
        s_gemm.synchronize()
        s_copy.synchronize()
        return time.perf_counter() - t

    wall(gemms)  # warm-up (cuBLAS handles, kernels)
    copy = lambda: dev.copy_to_device(pinned, dst, s_copy)  # noqa: E731
    gemm_s, copy_s, both_s = wall(gemms), wall(copy), wall(gemms, copy)
    res.update(
        gemm_s=gemm_s,
        copy_s=copy_s,
        both_s=both_s,
        overlap_saved_s=gemm_s + copy_s - both_s,
        overlaps=both_s < 0.9 * (gemm_s + copy_s),
    )
    return res


def section_cupy_fp16_kernel(cfg, ctx):
    cupy = _try_import("cupy")
    if cupy is None or cfg.dry_run or _gpu_free_bytes() is None:
        raise Skip("needs CuPy and a CUDA GPU")
    x = cupy.arange(1024, dtype=cupy.float16)
    y = (x * cupy.float16(0.5) + cupy.float16(1)).sum(dtype=cupy.float32)  # NVRTC compiles with cuda_fp16.h
    ker = cupy.ElementwiseKernel("float16 x", "float16 y", "y = __hmul(x, __float2half(2.0f))", "masc_fp16_check")
    z = ker(x)
    return {
        "sum": float(y),
        "hmul_ok": bool(cupy.allclose(z.astype(cupy.float32), x.astype(cupy.float32) * 2)),
        "cupy": cupy.__version__,
        "cuda_path": getattr(cupy.cuda, "get_cuda_path", lambda: None)(),
    }


def section_masc_metric_gpu(cfg, ctx):
    if cfg.dry_run:
        raise Skip("dry run")
    for mod in ("masc", "transformers", "tokenizers", "PIL"):
        if _try_import(mod) is None:
            raise Skip(f"{mod} is not importable (masc-metric 0.3.0 with transformers is needed)")
    torch = _try_import("torch")
    if torch is None or not torch.cuda.is_available():
        raise Skip("no CUDA torch")
    from masc import MaSC
    from PIL import Image

    from masc_engine.export.exporter import random_checkpoint_dir

    ckpt = random_checkpoint_dir("random:so400m-naflex")
    masc = MaSC(model_id=str(ckpt), device="cuda")
    rng = np.random.default_rng(0)
    imgs = [Image.fromarray(rng.integers(0, 255, (512, 512, 3), dtype=np.uint8)) for _ in range(9)]
    mask = np.zeros((512, 512), np.uint8)
    mask[128:384, 128:384] = 255
    masc.score(imgs[0], mask, imgs[1], mask, prompt="a dog on the beach", object_name="dog")
    torch.cuda.synchronize()
    t = time.perf_counter()
    n = 16
    for i in range(n):
        masc.score(imgs[i % 9], mask, imgs[(i + 1) % 9], mask, prompt="a dog on the beach", object_name="dog")
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t) / n
    return {
        "model": "random:so400m-naflex",
        "pairs_per_s": 1 / dt,
        "ms_per_pair": dt * 1e3,
        "note": "masc-metric 0.3.0 MaSC.score, one pair per call, 512x512 images",
    }


# --------------------------------------------------------------------------- driver


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes on CPU; numpy stands in for CuPy")
    ap.add_argument("--out", default=None, help="results JSON (default bench/results/gpu_check[.dryrun].json)")
    ap.add_argument("--budget-s", type=float, default=480.0, help="skip remaining sections past this many seconds")
    ap.add_argument("--only", default=None, help="comma-separated section names")
    ap.add_argument(
        "--copy-to", default=None, help="also write the results JSON into this directory (the device machine's $OUT)"
    )
    args = ap.parse_args(argv)
    cfg = Config(args.dry_run)
    out_path = Path(args.out) if args.out else RESULTS / ("gpu_check.dryrun.json" if args.dry_run else "gpu_check.json")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    copies = [out_path] + ([Path(args.copy_to) / out_path.name] if args.copy_to else [])

    def write(rep):
        for p in copies:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(json.dumps(_jsonable(rep), indent=2) + "\n")

    t_start = time.perf_counter()
    ctx = {"masc_import": _import_masc()}
    torch = _try_import("torch")
    ctx["device"] = "cuda" if (torch is not None and torch.cuda.is_available() and not args.dry_run) else "cpu"
    if not args.dry_run and ctx["device"] != "cuda":
        print("warning: no CUDA device visible to torch; GPU sections will be skipped or run on CPU", file=sys.stderr)
    report = {
        "script": "bench/gpu_check.py",
        "dry_run": args.dry_run,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "loadavg_1_5_15": list(os.getloadavg()),
        },
        "versions": {
            "python": platform.python_version(),
            "numpy": np.__version__,
            **{m: getattr(_try_import(m), "__version__", None) for m in ("torch", "cupy", "onnxruntime", "tensorrt")},
        },
        "sections": {},
    }

    sections = [("env", section_env), ("cp_head_cupy", section_cp_head_cupy), ("cp_head_torch", section_cp_head_torch)]
    for name, spec in cfg.models.items():

        def fidelity(cfg, ctx, name=name, spec=spec):
            if torch is None:
                raise Skip("torch is not importable")
            return _fidelity_for_model(torch, cfg, ctx, name, spec)

        sections.append((f"fidelity_{name}", fidelity))
    sections += [
        ("throughput", section_throughput),
        ("memory_plan", section_memory_plan),
        ("pipeline", section_pipeline),
        ("cupy_fp16_kernel", section_cupy_fp16_kernel),
        ("ort_cuda", section_ort_cuda),
        ("tensorrt", section_tensorrt),
        ("fp8_qdq", section_fp8_qdq),
        ("masc_metric_gpu", section_masc_metric_gpu),
    ]
    only = set(args.only.split(",")) if args.only else None
    for name, fn in sections:
        if only and name not in only:
            continue
        elapsed = time.perf_counter() - t_start
        if elapsed > args.budget_s:
            report["sections"][name] = {"status": "skipped", "reason": f"time budget ({args.budget_s:.0f}s) spent"}
            continue
        t = time.perf_counter()
        try:
            res = {"status": "ok", **fn(cfg, ctx)}
        except Skip as e:
            res = {"status": "skipped", "reason": str(e)}
        except Exception as e:  # noqa: BLE001 - record and go on
            res = {"status": "error", "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
        res["seconds"] = round(time.perf_counter() - t, 2)
        report["sections"][name] = res
        report["total_seconds"] = round(time.perf_counter() - t_start, 1)
        write(report)
        print(
            f"[{report['total_seconds']:7.1f}s] {name}: {res['status']}"
            + (f" ({res.get('reason') or res.get('error')})" if res["status"] != "ok" else ""),
            flush=True,
        )
    write(report)
    print("wrote " + ", ".join(map(str, copies)))
    errors = [k for k, v in report["sections"].items() if v["status"] == "error"]
    return 1 if errors else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
