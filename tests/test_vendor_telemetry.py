"""Scoring writes nothing under the user's home: ONNX Runtime's and OpenVINO's usage telemetry is
declined unless the user opted in (engine/vendor_telemetry.py).

Measured with onnxruntime 1.32 and openvino 2026.4 without the decline: a session writes
``~/.cache/Microsoft/DeveloperTools/.onnxruntime/{deviceid,onnxruntime.db}`` and ``import openvino``
writes ``~/intel/openvino_ga_cid`` and ``~/intel/stats``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("onnxruntime")

_SCRIPT = textwrap.dedent("""
    import numpy as np, onnx
    from onnx import TensorProto, helper
    import masc_engine  # declines ONNX Runtime's telemetry before onnxruntime is imported
    from masc_engine.engine.backends import openvino as ov_backend
    import onnxruntime as ort

    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    assert s.run(None, {"x": np.array([-1, 2], np.float32)})[0].tolist() == [0, 2]
    try:
        core = ov_backend.core()
    except Exception as e:  # openvino not installed: the ONNX Runtime half still ran
        print("no openvino:", type(e).__name__)
    else:
        c = core.compile_model(core.read_model(m.SerializeToString(), b""), "CPU")
        assert c(np.array([-1, 2], np.float32))[0].tolist() == [0, 2]
""")


def _files_under(root) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


@pytest.mark.slow
def test_scoring_libraries_write_nothing_under_home(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("ORT_DISABLE_TELEMETRY", "XDG_CACHE_HOME", "CI")}
    env["HOME"] = str(home)
    r = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert _files_under(home) == []


def test_an_explicit_choice_is_kept(monkeypatch):
    """setdefault: a user's own ORT_DISABLE_TELEMETRY value is not overwritten."""
    from masc_engine.engine.vendor_telemetry import decline_onnxruntime_telemetry

    monkeypatch.setenv("ORT_DISABLE_TELEMETRY", "0")
    decline_onnxruntime_telemetry()
    assert os.environ["ORT_DISABLE_TELEMETRY"] == "0"


def test_openvino_consent_given_is_kept():
    """Only a missing consent file reads as declined; an opt-in file still reads as accepted."""
    opt = pytest.importorskip("openvino_telemetry.utils.opt_in_checker")
    from masc_engine.engine.vendor_telemetry import decline_openvino_telemetry

    decline_openvino_telemetry()
    decline_openvino_telemetry()  # idempotent: wrapped once
    assert opt.OptInChecker.check.masc_engine_declines_by_default
    checker = opt.OptInChecker()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(opt.OptInChecker, "consent_file", lambda self: "/nonexistent/consent")
        assert checker.check(False) == opt.ConsentCheckResult.DECLINED
        mp.setattr(opt.OptInChecker, "consent_file", lambda self: __file__)
        mp.setattr(opt.OptInChecker, "consent_file_is_empty", lambda self: False)
        mp.setattr(opt.OptInChecker, "get_info_from_consent_file", lambda self: (None, "1"))
        assert checker.check(False) == opt.ConsentCheckResult.ACCEPTED
