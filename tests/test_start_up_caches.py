"""What a cold process reuses so that it starts faster, with the same results: graph files already
hashed (engine/verified_files.py) and OpenVINO's compiled models (engine/backends/openvino.py
``compiled_cache_dir``), both under the cache root's ``runtime/`` folder."""

from __future__ import annotations

import os
import shutil
import warnings

import numpy as np
import pytest

from masc_engine.engine import manifest as manifest_mod
from masc_engine.engine import verified_files
from masc_engine.engine.bundle import Bundle
from masc_engine.engine.cache_root import RUNTIME, SUBFOLDERS
from masc_engine.errors import BundleError


def _bundle(path) -> Bundle:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Bundle(path)


@pytest.fixture()
def own_root(tmp_path, monkeypatch):
    root = tmp_path / "cache-root"
    monkeypatch.setenv("MASC_ENGINE_CACHE", str(root))
    return root


@pytest.fixture()
def hashes(monkeypatch):
    """Counts the sha256 passes over bundle files (engine/manifest.py ``sha256_file``)."""
    calls: list[str] = []
    real = manifest_mod.sha256_file

    def counting(path, *a, **k):
        calls.append(os.path.basename(path))
        return real(path, *a, **k)

    monkeypatch.setattr(manifest_mod, "sha256_file", counting)
    return calls


def _copy(naflex_bundle, tmp_path):
    dst = tmp_path / "bundle"
    shutil.copytree(naflex_bundle, dst)
    return dst


def test_second_load_does_not_hash_an_unchanged_graph(naflex_bundle, tmp_path, own_root, hashes):
    b = _copy(naflex_bundle, tmp_path)
    _bundle(b).graph_file("vision")
    first = list(hashes)
    assert "vision.onnx" in first
    assert (own_root / RUNTIME / verified_files.VERIFIED).is_dir()
    hashes.clear()
    _bundle(b).graph_file("vision")  # a new Bundle: what a new process does
    assert hashes == []


def test_a_changed_graph_is_hashed_again_and_refused(naflex_bundle, tmp_path, own_root, hashes):
    b = _copy(naflex_bundle, tmp_path)
    _bundle(b).graph_file("text")
    path = b / "text.onnx"
    st = os.stat(path)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF  # same size
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # the old modification time put back
    hashes.clear()
    with pytest.raises(BundleError, match="sha256"):
        _bundle(b).graph_file("text")
    assert "text.onnx" in hashes


def test_a_record_of_another_digest_is_not_a_match(naflex_bundle, tmp_path, own_root):
    b = _copy(naflex_bundle, tmp_path)
    path = b / "pool.onnx"
    digest = manifest_mod.sha256_file(path)
    assert not verified_files.known(path, digest)
    assert verified_files.remember(path, digest)
    assert verified_files.known(path, digest)
    assert not verified_files.known(path, "0" * 64)
    verified_files.record_path(path).write_text("not json")
    assert not verified_files.known(path, digest)


def test_a_planted_record_is_not_read_past_its_budget(tmp_path, own_root):
    """A record under the cache root is read only when it is a regular file within
    MAX_RECORD_BYTES, opened without following links and without blocking on a FIFO: a valid
    record padded past the budget, a link to /dev/zero and a FIFO are all "not known"."""
    path = tmp_path / "g.onnx"
    path.write_bytes(b"graph")
    digest = manifest_mod.sha256_file(path)
    assert verified_files.remember(path, digest) and verified_files.known(path, digest)
    rec = verified_files.record_path(path)
    valid = rec.read_text()
    rec.write_text(valid + " " * verified_files.MAX_RECORD_BYTES)  # still valid JSON, over the budget
    assert not verified_files.known(path, digest)
    rec.unlink()
    os.symlink("/dev/zero", rec)
    assert not verified_files.known(path, digest)
    rec.unlink()
    os.mkfifo(rec)
    assert not verified_files.known(path, digest)


def test_runtime_folder_is_one_the_clean_command_removes():
    assert RUNTIME in SUBFOLDERS


ov = pytest.importorskip("openvino", reason="the compiled-model cache needs openvino (the [openvino] extra)")


def test_openvino_second_compile_reuses_the_cached_model(naflex_bundle, own_root):
    from masc_engine.engine.backends import openvino as ovb
    from masc_engine.engine.manifest import fingerprint

    bundle = _bundle(naflex_bundle)
    first = ovb.load_runner(bundle, "pool")
    folder = own_root / RUNTIME / "openvino" / fingerprint(bundle.manifest)
    blobs = sorted(p.name for p in folder.iterdir())
    assert blobs, "the compiled model was not cached"
    second = ovb.load_runner(_bundle(naflex_bundle), "pool")
    assert sorted(p.name for p in folder.iterdir()) == blobs  # found, not compiled and written again
    rng = np.random.default_rng(0)
    feeds = {
        "hidden": rng.normal(size=(2, 16, bundle.graph("pool")["inputs"][0]["shape"][-1])).astype(np.float32),
        "key_padding_mask": rng.random((2, 16)) < 0.4,
    }
    feeds["key_padding_mask"][:, 0] = False
    a, c = first.run(feeds), second.run(feeds)
    assert all(np.array_equal(a[k], c[k]) for k in a)


def test_a_bundle_that_asks_for_no_compiled_model_cache_writes_none(naflex_bundle, own_root):
    """``Bundle.compiled_model_cache = False`` (a bf16 certification's candidates, export/cpu_precision.py):
    OpenVINO compiles the graph in memory; the cache root gets no folder for it (fp32 pool graph:
    runs on any CPU)."""
    from masc_engine.engine.backends import openvino as ovb

    bundle = _bundle(naflex_bundle)
    bundle.compiled_model_cache = False
    assert ovb.compiled_cache_dir(bundle) is None
    ovb.load_runner(bundle, "pool")
    assert not (own_root / RUNTIME / "openvino").exists() or not list((own_root / RUNTIME / "openvino").iterdir())
