"""The export plan (export/plan.py), the library's loggers on the terminal (cli/logs.py) and the
heap trim (engine/memory.py).

- ``--precision bf16-cpu`` is fp32 graphs with ``certify="bf16-cpu"``; the manifest's mode stays
  ``bf16-cpu``.
- Every illegal combination of precision, certification, backend and model kind is refused by the
  library in one line (:class:`ExportPlanError`), and by masc-export as a usage error (exit 2)
  with the same line.
- The library's lines reach stderr as their message alone through one handler, also while
  masc-export sends library output to its log file.
"""

from __future__ import annotations

import dataclasses
import logging
import platform
import sys

import pytest
from click.testing import CliRunner

from masc_engine.cli import logs
from masc_engine.cli.export_cmd import main as export_main
from masc_engine.engine import memory
from masc_engine.engine.backends.openvino import BF16_CPU_MODE
from masc_engine.errors import MascEngineError
from masc_engine.export.plan import ExportPlan, ExportPlanError
from masc_engine.export.plan_steps import resolve_kind


def test_bf16_cpu_is_a_certification_of_fp32_graphs():
    plan = ExportPlan.from_option("bf16-cpu", model="random:tiny-naflex", calibration_pairs="c.csv")
    assert (plan.precision, plan.certify, plan.mode) == ("fp32", "bf16-cpu", BF16_CPU_MODE)
    assert plan.certification_options == {"calibration": "c.csv", "heldout": None}
    plain = ExportPlan.from_option("fp16", model="m")
    assert (plain.precision, plain.certify, plain.mode, plain.certification_options) == ("fp16", None, "fp16", None)
    assert ExportPlan.from_option(None, model="m").mode == "fp32"  # no --precision: fp32 graphs
    assert ExportPlan.from_option(None, model="m").precision is None  # engines: the bundle's own


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"precision": "fp16", "certify": "bf16-cpu"}, "bf16-cpu certifies fp32 graphs, not fp16"),
        ({"precision": "fp64"}, "export plan: precision must be one of"),
        ({"certify": "bf16-gpu"}, "export plan: certify must be one of"),
        ({"backend": "coreml"}, "export plan: backend must be one of"),
        ({"kind": "captioner"}, "export plan: kind must be one of"),
        (
            {"precision": "fp32", "certify": "bf16-cpu", "backend": "tensorrt"},
            "--precision bf16-cpu makes a bundle for OpenVINO's CPU plugin: use --backend onnx",
        ),
        ({"precision": "int8", "backend": "tensorrt"}, "--precision int8 makes an ONNX Runtime (CPU) bundle"),
        ({"precision": "fp8", "backend": "tensorrt"}, "--precision fp8 makes an ONNX bundle certified on CPU"),
        ({"precision": "fp16", "heldout_pairs": "h.csv"}, "--calibration-pairs / --heldout-pairs go with"),
        ({"engines_only": True}, "--engines-only builds TensorRT engines: add --backend tensorrt"),
        ({"kind": "segmenter", "precision": "bf16"}, "a segmenter bundle exports fp32 or fp16"),
        ({"kind": "segmenter", "precision": "fp32", "certify": "bf16-cpu"}, "a segmenter bundle exports fp32 or fp16"),
        ({"kind": "segmenter", "max_num_patches": 256}, "a segmenter bundle exports fp32 or fp16"),
        ({"kind": "segmenter", "backend": "tensorrt"}, "a segmenter bundle exports fp32 or fp16"),
        ({"kind": "scorer", "precision": "int8"}, "--precision int8 needs --gate-pairs CSV"),
        ({"precision": "fp32", "bf16_graphs": ("vision", "text")}, "--bf16-graphs goes with --precision bf16-cpu"),
        ({"certify": "bf16-cpu", "bf16_graphs": ("text", "text")}, "--bf16-graphs needs distinct graph names"),
        ({"certify": "bf16-cpu", "bf16_graphs": ()}, "--bf16-graphs needs distinct graph names"),
        (
            {"kind": "scorer", "certify": "bf16-cpu", "bf16_graphs": ("vision", "pool")},
            "--bf16-graphs: a scorer bundle certifies vision and text for bf16, not pool",
        ),
        (
            {"kind": "embedder", "certify": "bf16-cpu", "bf16_graphs": ("vision",)},
            "--bf16-graphs: an embedder bundle certifies image and text for bf16, not vision",
        ),
    ],
)
def test_illegal_plans_are_refused_in_one_line(settings, message):
    with pytest.raises(ExportPlanError, match="^" + message.replace("(", r"\(").replace(")", r"\)")) as e:
        ExportPlan("random:tiny-naflex", **settings)
    assert "\n" not in str(e.value) and isinstance(e.value, MascEngineError) and isinstance(e.value, ValueError)


def test_legal_plans_pass_and_the_kind_rules_wait_for_the_kind():
    for settings in (
        {"precision": "fp16", "backend": "tensorrt"},
        {"precision": "fp8", "heldout_pairs": "h.csv"},
        {"precision": "int8", "gate_pairs": "g.csv", "kind": "scorer"},
        {"backend": "tensorrt", "engines_only": True},
        {"kind": "segmenter", "precision": "fp16"},
    ):
        ExportPlan("m", **settings)
    unknown = ExportPlan("random:clipseg-tiny", precision="int8")  # kind not known yet: no refusal
    with pytest.raises(ExportPlanError, match="a segmenter bundle"):
        dataclasses.replace(unknown, kind="segmenter")  # a frozen plan re-validates on replace
    with pytest.raises(ExportPlanError, match="a segmenter bundle"):
        resolve_kind(unknown, "unused")  # random:clipseg-tiny is a segmenter preset (no network)
    assert resolve_kind(ExportPlan("random:tiny-naflex"), "unused").kind == "scorer"


def test_engines_only_reads_the_kind_of_the_bundle_at_out(tmp_path):
    from masc_engine.engine.manifest import FORMAT, FORMAT_VERSION

    (tmp_path / "manifest.json").write_text(
        f'{{"format": "{FORMAT}", "format_version": {FORMAT_VERSION}, "kind": "segmenter"}}'
    )
    plan = ExportPlan("ignored", backend="tensorrt", engines_only=True)
    with pytest.raises(ExportPlanError, match="a segmenter bundle"):
        resolve_kind(plan, tmp_path)
    assert resolve_kind(plan, tmp_path / "absent").kind == "scorer"


def test_engines_only_reads_the_manifest_under_its_cap(tmp_path, monkeypatch):
    """A sparse 64 GiB manifest.json costs a stat, not a read into memory; the bundle's load then
    refuses it in one line."""
    import builtins

    from masc_engine.engine.manifest import MAX_MANIFEST_BYTES

    with open(tmp_path / "manifest.json", "wb") as f:
        f.truncate(64 << 30)
    opened = []
    real_open = builtins.open
    monkeypatch.setattr(builtins, "open", lambda p, *a, **k: opened.append(str(p)) or real_open(p, *a, **k))
    plan = ExportPlan("ignored", backend="tensorrt", engines_only=True)
    assert resolve_kind(plan, tmp_path).kind == "scorer"
    assert not any(p.endswith("manifest.json") for p in opened), f"read past the {MAX_MANIFEST_BYTES}-byte cap"


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--precision", "bf16-cpu", "--backend", "tensorrt"],
            "--precision bf16-cpu makes a bundle for OpenVINO's CPU plugin: use --backend onnx",
        ),
        (
            ["--precision", "fp16", "--calibration-pairs", "README.md"],
            "--calibration-pairs / --heldout-pairs go with --precision bf16-cpu or fp8",
        ),
        (["--model", "random:clipseg-tiny", "--precision", "bf16-cpu"], "a segmenter bundle exports fp32 or fp16"),
        (["--model", "random:tiny-naflex", "--precision", "int8"], "--precision int8 needs --gate-pairs CSV"),
        (
            ["--model", "random:tiny-naflex", "--precision", "bf16-cpu", "--bf16-graphs", "vision,cp"],
            "--bf16-graphs: a scorer bundle certifies vision and text for bf16, not cp",
        ),
        (["--bf16-graphs", "vision,text"], "--bf16-graphs goes with --precision bf16-cpu"),
    ],
)
def test_masc_export_reports_the_plan_refusal_as_a_usage_error(tmp_path, args, message):
    res = CliRunner().invoke(export_main, ["-o", str(tmp_path / "out"), *args])
    assert res.exit_code == 2 and f"Error: {message}" in res.output, res.output
    assert not (tmp_path / "out").exists()


def test_export_bundle_refuses_a_certification_of_reduced_graphs_before_any_work(tmp_path):
    from masc_engine.export.exporter import export_bundle

    with pytest.raises(ExportPlanError, match="bf16-cpu certifies fp32 graphs, not fp16"):
        export_bundle("random:tiny-naflex", tmp_path / "b", precision="fp16", certify="bf16-cpu")
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def library_handler():
    """The CLI's handler on the masc_engine logger, removed afterwards (level restored)."""
    lib, root = logging.getLogger("masc_engine"), logging.getLogger()
    level, before, before_root = lib.level, list(lib.handlers), list(root.handlers)
    yield logs.show_library_log()
    for logger, kept in ((lib, before), (root, before_root)):
        for h in logger.handlers[:]:
            if h not in kept:
                logger.removeHandler(h)
    lib.setLevel(level)


def test_library_lines_reach_stderr_as_their_message_alone(library_handler, capsys):
    assert logs.show_library_log() is library_handler  # installed once: no doubled lines
    logging.getLogger("masc_engine.export.stages").info("validated vision [validate vision: 1.0 s]")
    logging.getLogger("masc_engine.engine.backends.tensorrt").warning("profile maxima lowered")
    logging.getLogger("masc_engine.export.stages").debug("not shown")
    err = capsys.readouterr().err
    assert err.splitlines().count("validated vision [validate vision: 1.0 s]") == 1
    assert "profile maxima lowered\n" in err and "WARNING" not in err and "not shown" not in err


def test_another_librarys_root_warning_does_not_double_the_library_lines(library_handler, monkeypatch, capsys):
    """ONNX Runtime's quantizer warns through ``logging.warning()`` on the root logger. With no
    handler there, that call ran ``logging.basicConfig()`` and masc-export --precision int8 then
    printed every line twice (``INFO:masc_engine.export.stages:...`` beside it, in its log). The
    warning itself is shown once, naming its logger."""
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])  # a command's process: no pytest capture handlers
    logs.show_library_log()
    logging.warning("Please consider to run pre-processing before quantization.")
    logging.getLogger("masc_engine.export.stages").info("quantized vision -> int8")
    logs.show_library_log()  # a second command in the process: no second root handler
    logging.getLogger("masc_engineering").warning("a name that only starts like ours")
    noisy = logging.getLogger("onnxruntime.quantization")
    monkeypatch.setattr(noisy, "level", logging.INFO)
    noisy.info("an INFO record of another library: not shown")
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "root WARNING: Please consider to run pre-processing before quantization.",
        "quantized vision -> int8",
        "masc_engineering WARNING: a name that only starts like ours",
    ]


def test_a_programs_own_root_handler_is_left_to_show_other_libraries(library_handler, monkeypatch, capsys):
    """A program that configured logging before calling a command's main in-process keeps its root
    handler as the only one: another library's warning is shown once, in the program's format."""
    root = logging.getLogger()
    mine = logging.StreamHandler(sys.stderr)
    mine.setFormatter(logging.Formatter("PROGRAM %(name)s %(message)s"))
    monkeypatch.setattr(root, "handlers", [mine])
    logs.show_library_log()
    logging.getLogger("onnxruntime").warning("ort warns")
    assert root.handlers == [mine]
    assert capsys.readouterr().err.splitlines() == ["PROGRAM onnxruntime ort warns"]


def test_library_lines_stay_on_the_terminal_while_library_output_goes_to_the_log(library_handler, tmp_path, capsys):
    from masc_engine.cli.quiet import libraries_to_log

    log_file = tmp_path / "x.export.log"
    with libraries_to_log(log_file):
        logging.getLogger("masc_engine.export.exporter").info("bundle written: out (fp32)")
        print("torch chatter", file=sys.stderr)
    assert "bundle written: out (fp32)\n" in capsys.readouterr().err
    text = log_file.read_text()
    assert "torch chatter" in text and "bundle written" not in text
    logging.getLogger("masc_engine.export.exporter").info("after the block")
    assert "after the block" in capsys.readouterr().err


def test_release_heap_trims_on_glibc_only(monkeypatch):
    assert memory.release_heap() is (memory.glibc() is not None)
    monkeypatch.setattr(platform, "libc_ver", lambda *a, **k: ("musl", "1.2"))
    monkeypatch.setattr(memory, "_LIBC", None)
    assert memory.glibc() is None and memory.release_heap() is False
