"""Shared fixtures: tiny random-weight bundles (exported once per session) and the oracle.

The oracle is masc-metric 0.3.0 (import ``masc``) on the same random-weight checkpoint
directory the bundle was exported from. Tests needing torch/transformers/masc skip with a reason
when those are missing (a runtime-only install); CI installs them (see .ci/run).
"""

from __future__ import annotations

import gc
import multiprocessing.process
import os
import socket
import subprocess
import warnings
from pathlib import Path

import pytest
from PIL import Image

from support import (
    CommandExport,
    EmbedderBundles,
    build_once,
    export_by_command,
    export_tiny,
    photo_sets,
    run_shared_dir,
)


def pytest_configure(config):
    warnings.filterwarnings("ignore", message=".*random weights.*")
    if os.environ.get("PYTEST_XDIST_WORKER") and os.environ.get("MASC_TEST_WORKER_THREADS", "1") == "1":
        _one_compute_thread_per_worker()


#: ``MASC_TEST_GC_FREEZE=0`` keeps every object in the garbage collector's reach (for a comparison).
FREEZE = os.environ.get("MASC_TEST_GC_FREEZE", "1") == "1"


def pytest_collection_finish(session):
    _freeze_survivors()


@pytest.fixture(scope="module", autouse=True)
def _freeze_what_outlives_each_module():
    """After each test module, what survives a full collection leaves the collector's reach.

    Why: the exporter collects garbage around each stage (export/stages.py ``release_memory``,
    so that a stage's memory peak is its own) and a full collection walks every tracked object of
    the process. In a test process that is pytest's and every imported library's objects, which
    a masc-export process does not hold: those collections took ~7 % of the suite's CPU
    (py-spy over ``-m "not slow"``). What outlives a module is imports, session fixtures and
    caches; frozen (``gc.freeze``) it is no longer walked, and whatever becomes garbage by
    reference count is still freed at once."""
    yield
    _freeze_survivors()


def _freeze_survivors() -> None:
    if FREEZE:
        gc.collect()
        gc.freeze()


def _one_compute_thread_per_worker() -> None:
    """An xdist worker runs torch and ONNX Runtime with one intra-op thread each.

    scripts/test.sh starts one worker per core; torch and ONNX Runtime size their pools to every
    core and their threads spin while they wait, so two workers ran four busy compute threads on
    two cores. Measured on a 2-core Xeon with AMX, shared host, one run each, the same hour:
    ``scripts/test.sh -m "not slow"`` 350 s -> 278 s; the whole suite 871 s -> 712 s of pytest,
    1379 s -> 1081 s of user CPU (``MASC_TEST_WORKER_THREADS=default`` gives the libraries' own
    thread counts, for such a comparison). A session given a thread count keeps it; processes the
    tests start keep their defaults; numpy's BLAS is untouched (tests/test_batch_invariance.py
    compares its one- and many-thread products)."""
    try:
        import torch
    except ImportError:  # without the export extra
        pass
    else:
        torch.set_num_threads(1)
    import onnxruntime as ort

    class OneThreadSessionOptions(ort.SessionOptions):
        def __init__(self) -> None:
            super().__init__()
            self.intra_op_num_threads = 1

    ort.SessionOptions = OneThreadSessionOptions


@pytest.fixture(scope="session", params=photo_sets())
def photo_dir(request) -> Path:
    """A real-photo set folder (``pairs.csv``, ``gallery.csv``, ``images/``, ``masks/``)."""
    return request.param


@pytest.fixture(autouse=True)
def _what_starts_processes_is_marked(request, monkeypatch):
    """A test that starts a process (a command, a worker, a Ray cluster, a browser) or a server
    listening on a socket carries ``@pytest.mark.slow``, so that ``-m "not slow"`` stays the inner
    loop and the slow inventory stays complete. What the test itself starts is seen (fixtures of a
    wider scope start before this one and are not counted)."""
    if request.node.get_closest_marker("slow"):
        yield
        return
    started: list[str] = []
    popen_init, process_start, listen = (
        subprocess.Popen.__init__,
        multiprocessing.process.BaseProcess.start,
        socket.socket.listen,
    )

    def on_popen(self, args, *a, **k):
        # platform.processor()'s own query, and matplotlib's font manager listing the system's fonts
        # the first time it runs on a machine (its font cache): neither is the test's process.
        if not (isinstance(args, (list, tuple)) and args[:1] in (["uname"], ["fc-list"])):
            started.append(f"the command {str(args)[:80]}")
        return popen_init(self, args, *a, **k)

    def on_start(self):
        started.append("a multiprocessing worker")
        return process_start(self)

    def on_listen(self, *a):
        started.append("a server listening on a socket")
        return listen(self, *a)

    monkeypatch.setattr(subprocess.Popen, "__init__", on_popen)
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", on_start)
    monkeypatch.setattr(socket.socket, "listen", on_listen)
    yield
    if started:
        pytest.fail(f"{request.node.nodeid} started {started[0]} without @pytest.mark.slow", pytrace=False)


_PILLOW_MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS


@pytest.fixture(autouse=True)
def _pillow_pixel_limit():
    """Pillow's decompression-bomb limit is process-wide and masc-serve's ``create_app`` sets it
    (``--max-pixels``): a test that builds the app in-process (a module-scoped app included) must
    not change it for the tests after it (masc-report's pixel limit and masc-run's default file
    cap are read from it)."""
    yield
    Image.MAX_IMAGE_PIXELS = _PILLOW_MAX_IMAGE_PIXELS  # Pillow's default, as the process started


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    # Random checkpoints are cached per test run (shared by its xdist workers: the cache's writes
    # are atomic renames) unless MASC_ENGINE_CACHE points elsewhere.
    d = Path(os.environ.get("MASC_ENGINE_CACHE") or run_shared_dir(tmp_path_factory) / "masc-cache")
    d.mkdir(parents=True, exist_ok=True)
    os.environ["MASC_ENGINE_CACHE"] = str(d)
    return d


@pytest.fixture(scope="session")
def command_export(tmp_path_factory, cache_dir) -> CommandExport:
    """``masc-export --model random:tiny-naflex`` run once as a user runs it (tests/support
    ``CommandExport``): its bundle is ``naflex_bundle``; its output and log are the command's."""
    return export_by_command(tmp_path_factory)


@pytest.fixture(scope="session")
def naflex_bundle(command_export) -> Path:
    """The tiny NaFlex model exported by the command line (fp32, validated, with the ort-cpu variant)."""
    return command_export.bundle


@pytest.fixture(scope="session")
def fp16_bundle(tmp_path_factory, cache_dir, naflex_bundle) -> Path:
    """The tiny NaFlex model exported with ``--precision fp16`` (mixed-precision graphs), from the
    fp32 graphs ``naflex_bundle`` traced (tests/doubles ``graphs_from``: not traced twice)."""
    return export_tiny("naflex", tmp_path_factory, cache_dir, precision="fp16", graphs_of=naflex_bundle)


@pytest.fixture(scope="session")
def fixed_bundle(tmp_path_factory, cache_dir) -> Path:
    return export_tiny("fixed", tmp_path_factory, cache_dir)


@pytest.fixture(scope="session")
def base_bundle(tmp_path_factory, cache_dir) -> Path:
    """A base-shaped random-weight NaFlex bundle (SigLIP2-base sizes: 12 layers, D = 768) at a
    patch budget of 256, exported once per session without the post-export validation (tested on
    the tiny models; here only the shapes matter): the user shape for batch-invariance checks."""
    pytest.importorskip("torch", reason="exporting a test bundle needs the export extra (torch)")
    from masc_engine.export.exporter import export_bundle

    def build(out: Path) -> Path:
        return export_bundle("random:base-naflex", out, max_num_patches=256, validate=False)

    return build_once(tmp_path_factory, "bundle-base", build)


@pytest.fixture(scope="session")
def seg_bundle(tmp_path_factory, cache_dir) -> Path:
    """A random-weight segmenter bundle: ``masc-export --model random:clipseg-tiny --out B``,
    through the command line (tests/test_segmenter.py, tests/test_segmenter_jobs.py)."""
    pytest.importorskip("torch", reason="exporting a segmenter bundle needs the export extra (torch)")
    pytest.importorskip("transformers", reason="exporting a segmenter bundle needs transformers")
    from click.testing import CliRunner

    from masc_engine.cli.export_cmd import main

    def build(folder: Path) -> Path:
        out = folder / "clipseg"
        res = CliRunner().invoke(main, ["--model", "random:clipseg-tiny", "--out", str(out)])
        assert res.exit_code == 0, res.output
        return out

    return build_once(tmp_path_factory, "segmenter", build)


@pytest.fixture(scope="session")
def reference_model(seg_bundle):
    """transformers' ``CLIPSegForImageSegmentation`` and processor of the segmenter bundle's
    random checkpoint (the reference of the mask recipe, export/segmenter_reference.py)."""
    from masc_engine.export.segmenter import load_segmenter

    model, processor, _ = load_segmenter("random:clipseg-tiny")
    return model, processor


@pytest.fixture(scope="session")
def embedder_bundles(tmp_path_factory, cache_dir) -> EmbedderBundles:
    """Random-weight embedder bundles by preset (``embedder_bundles["clip-tiny"]``), each exported
    once per run on first use (tests/support ``EmbedderBundles``)."""
    return EmbedderBundles(tmp_path_factory)


@pytest.fixture(scope="session", params=["naflex", "fixed"])
def any_bundle(request) -> Path:
    return request.getfixturevalue(f"{request.param}_bundle")
