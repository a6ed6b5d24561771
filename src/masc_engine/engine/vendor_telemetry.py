"""No usage telemetry from the inference libraries unless the user opted in.

Two libraries masc-engine loads send usage data by default and write files outside the checkout:

- **ONNX Runtime** (>= 1.29 on Linux) records a device id and events under
  ``~/.cache/Microsoft/DeveloperTools/.onnxruntime/`` unless ``ORT_DISABLE_TELEMETRY=1`` is set
  *before* ``import onnxruntime`` (setting it afterwards has no effect; measured with 1.32).
  :func:`decline_onnxruntime_telemetry` sets it with ``os.environ.setdefault``, so a user who sets
  the variable (to anything) keeps their choice.
- **OpenVINO** (``openvino_telemetry``, imported by ``import openvino``) treats a missing consent
  file as consent: it writes ``~/intel/openvino_ga_cid`` and ``~/intel/stats`` and sends Google
  Analytics events. :func:`decline_openvino_telemetry` makes a *missing* consent file read as
  declined; an explicit opt-in (``opt_in_out --opt_in``, a consent file holding ``1``) is kept.

Both run before the library is first imported: the package ``__init__`` calls the first, the
OpenVINO backend's ``import_openvino`` the second (docs/install.md, "Files written").
"""

from __future__ import annotations

import os


def decline_onnxruntime_telemetry() -> None:
    """Set ``ORT_DISABLE_TELEMETRY=1`` unless the user set it; no effect once onnxruntime is imported."""
    os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")


def decline_openvino_telemetry() -> None:
    """Read a missing OpenVINO consent file as "declined" (idempotent; nothing if not installed)."""
    try:
        from openvino_telemetry.utils.opt_in_checker import ConsentCheckResult, OptInChecker
    except ImportError:
        return
    original = OptInChecker.check
    if getattr(original, "masc_engine_declines_by_default", False):
        return

    def check(self: object, *args: object, **kwargs: object) -> object:
        result = original(self, *args, **kwargs)
        return ConsentCheckResult.DECLINED if result == ConsentCheckResult.NO_FILE else result

    check.masc_engine_declines_by_default = True  # type: ignore[attr-defined]  # a marker on the function object
    OptInChecker.check = check
