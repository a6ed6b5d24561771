"""OpenVINO's compile options and compiled-model cache folder, pinned by values
(engine/backends/openvino.py ``compile_config``, ``compiled_cache_dir``).

What these pin: each compiled graph's CPU plugin properties (the precision hint always set,
latency over throughput, performance over accuracy execution mode, dynamic quantization off, the
thread count only when given); a bundle's cache folder is the same folder on every call (a later
process finds it), is ``<cache root>/runtime/openvino/<bundle fingerprint>``, and is None, not an
error, when the cache root cannot be created or the bundle asks for no cache.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from masc_engine.engine.backends import openvino as ovb
from masc_engine.engine.cache_root import RUNTIME
from masc_engine.engine.manifest import fingerprint

MANIFEST = {"files": {"vision.onnx": "ab" * 32}, "image": {"patch_size": 16}}


def test_compile_options_of_a_graph():
    assert ovb.compile_config("fp32") == {
        "INFERENCE_PRECISION_HINT": "f32",
        "PERFORMANCE_HINT": "LATENCY",
        "EXECUTION_MODE_HINT": "PERFORMANCE",
        "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0,
    }
    assert ovb.compile_config("bf16", threads=3) == {
        "INFERENCE_PRECISION_HINT": "bf16",
        "PERFORMANCE_HINT": "LATENCY",
        "EXECUTION_MODE_HINT": "PERFORMANCE",
        "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0,
        "INFERENCE_NUM_THREADS": 3,
    }


def test_the_cache_folder_is_the_same_on_every_call(tmp_path, monkeypatch):
    monkeypatch.setenv("MASC_ENGINE_CACHE", str(tmp_path / "root"))
    bundle = SimpleNamespace(manifest=MANIFEST, compiled_model_cache=True)
    want = tmp_path / "root" / RUNTIME / "openvino" / fingerprint(MANIFEST)
    assert ovb.compiled_cache_dir(bundle) == want and want.is_dir()
    assert ovb.compiled_cache_dir(bundle) == want  # created by an earlier process: found, not refused
    other = SimpleNamespace(manifest={**MANIFEST, "files": {"vision.onnx": "cd" * 32}}, compiled_model_cache=True)
    assert ovb.compiled_cache_dir(other) not in (want, None)


@pytest.mark.parametrize("asks", [True, False])
def test_no_cache_folder_where_the_root_cannot_be_made_or_none_is_asked(tmp_path, monkeypatch, asks):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("MASC_ENGINE_CACHE", str(blocker / "root"))  # under a file: mkdir fails
    assert ovb.compiled_cache_dir(SimpleNamespace(manifest=MANIFEST, compiled_model_cache=asks)) is None
    monkeypatch.setenv("MASC_ENGINE_CACHE", str(tmp_path / "root"))
    made = ovb.compiled_cache_dir(SimpleNamespace(manifest=MANIFEST, compiled_model_cache=asks))
    assert (made is not None) is asks and (tmp_path / "root").exists() is asks
