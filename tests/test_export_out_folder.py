"""masc-export replaces ``--out`` only when it is empty or a bundle it wrote: nothing else is erased.

The export itself is a stub (``export_bundle(into=...)`` writes a two-file bundle into the staging
folder), so these run in milliseconds; the rule is export/exporter.py ``check_replaceable``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from masc_engine.engine.manifest import write_manifest
from masc_engine.errors import BundleError
from masc_engine.export.exporter import export_bundle


def _stub_export(stage: Path, *args) -> None:
    """What a real export leaves in its staging folder, in small: graphs and a manifest."""
    (stage / "vision.onnx").write_bytes(b"new graph")
    write_manifest(stage, {"files": {"vision.onnx": ""}})


def _bundle(folder: Path, content: bytes = b"old graph") -> Path:
    folder.mkdir(parents=True)
    (folder / "vision.onnx").write_bytes(content)
    write_manifest(folder, {"files": {"vision.onnx": ""}})
    return folder


def _export(out: Path) -> Path:
    return export_bundle("random:tiny-naflex", out, validate=False, into=_stub_export)


def _tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_an_absent_or_empty_folder_or_a_bundle_is_replaced(tmp_path):
    assert _tree(_export(tmp_path / "absent"))["vision.onnx"] == b"new graph"
    (tmp_path / "empty").mkdir()
    assert _tree(_export(tmp_path / "empty"))["vision.onnx"] == b"new graph"
    old = _bundle(tmp_path / "bundle")
    (old / "tensorrt-fp16").mkdir()  # an engine set built into the bundle is the bundle's own
    (old / "tensorrt-fp16" / "vision.plan").write_bytes(b"engine")
    assert _tree(_export(old)) == {"manifest.json": (old / "manifest.json").read_bytes(), "vision.onnx": b"new graph"}
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no stage or old copy left


def test_a_folder_holding_some_manifest_json_is_not_erased(tmp_path):
    out = tmp_path / "myext"
    (out / "src").mkdir(parents=True)
    (out / "manifest.json").write_text(json.dumps({"manifest_version": 3}))
    (out / "src" / "app.js").write_text("precious")
    before = _tree(out)
    with pytest.raises(BundleError, match="neither empty nor a bundle.*choose another --out"):
        _export(out)
    assert _tree(out) == before


def test_a_bundle_with_the_users_files_beside_it_is_not_erased(tmp_path):
    out = _bundle(tmp_path / "b")
    (out / "notes.md").write_text("my notes")
    (out / "runs").mkdir()
    (out / "runs" / "scores.csv").write_text("key,cp\n")
    before = _tree(out)
    with pytest.raises(
        BundleError, match=r"also holds 2 file\(s\) its manifest does not list \(notes.md, runs/scores.csv\)"
    ):
        _export(out)
    assert _tree(out) == before


def test_a_linked_folder_inside_a_bundle_or_as_out_is_not_replaced(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "data.bin").write_bytes(b"keep")
    out = _bundle(tmp_path / "b")
    os.symlink(elsewhere, out / "linked")
    with pytest.raises(BundleError, match=r"\(linked\)"):
        _export(out)
    link = tmp_path / "link"
    os.symlink(_bundle(tmp_path / "target"), link)
    with pytest.raises(BundleError, match="is a link"):
        _export(link)
    assert (elsewhere / "data.bin").read_bytes() == b"keep" and (tmp_path / "target" / "vision.onnx").is_file()


def test_a_file_as_out_is_refused(tmp_path):
    f = tmp_path / "out"
    f.write_text("x")
    with pytest.raises(BundleError, match="not a directory"):
        _export(f)
    assert f.read_text() == "x"
