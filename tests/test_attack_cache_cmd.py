"""masc-cache's refusals and sizes pinned by values: the home folder as the root, a linked
subfolder sized 0, an unknown subfolder name, a root that is a file, the info lines."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from masc_engine.cli.cache_cmd import main
from masc_engine.engine.cache_root import CacheRootError, check_cleanable, remove_subfolder, tree_bytes


def _write(path: Path, n: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * n)
    return path


def test_the_home_folder_as_root_is_refused(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("MASC_ENGINE_CACHE", str(home))
    with pytest.raises(CacheRootError, match="the home folder"):
        check_cleanable(home)
    r = CliRunner().invoke(main, ["clean", "--all"])
    assert r.exit_code == 1 and "home folder" in r.output and home.is_dir()


def test_a_linked_subfolder_is_zero_bytes_and_not_followed(tmp_path, monkeypatch):
    elsewhere = tmp_path / "elsewhere"
    _write(elsewhere / "big.bin", 5000)
    root = tmp_path / "cache"
    root.mkdir()
    (root / "random-models").symlink_to(elsewhere, target_is_directory=True)
    _write(root / "tensorrt" / "t.cache", 300)
    assert tree_bytes(root / "random-models") == 0
    assert tree_bytes(root) == 300
    monkeypatch.setenv("MASC_ENGINE_CACHE", str(root))
    out = CliRunner().invoke(main, ["info"]).output
    assert "a symbolic link, not followed" in out and "(300 bytes)" in out and "5,000" not in out
    r = CliRunner().invoke(main, ["clean", "--checkpoints", "--dry-run"])
    assert r.exit_code == 0 and "would remove" in r.output and "would free 0 B (0 bytes)" in r.output
    assert (elsewhere / "big.bin").stat().st_size == 5000 and (root / "random-models").is_symlink()


def test_an_unknown_subfolder_name_is_refused(tmp_path):
    root = tmp_path / "cache"
    _write(root / "other" / "f", 10)
    with pytest.raises(CacheRootError, match="not a subfolder"):
        remove_subfolder(root, "other")
    assert (root / "other" / "f").exists()


def test_a_root_that_is_a_file_is_refused(tmp_path, monkeypatch):
    f = _write(tmp_path / "cachefile", 10)
    with pytest.raises(CacheRootError, match="not a folder"):
        check_cleanable(f)
    monkeypatch.setenv("MASC_ENGINE_CACHE", str(f))
    r = CliRunner().invoke(main, ["clean", "--all"])
    assert r.exit_code == 1 and "not a folder" in r.output and f.read_bytes() == b"x" * 10


def test_tensorrt_alone_leaves_the_checkpoints(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    _write(root / "random-models" / "m", 100)
    _write(root / "tensorrt" / "t", 50)
    monkeypatch.setenv("MASC_ENGINE_CACHE", str(root))
    r = CliRunner().invoke(main, ["clean", "--tensorrt"])
    assert r.exit_code == 0 and "freed 50 B (50 bytes)" in r.output
    assert (root / "random-models" / "m").exists() and not (root / "tensorrt").exists()


def test_info_names_foreign_entries_and_the_rule(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    _write(root / "random-models" / "m", 100)
    _write(root / "notes.txt", 7)
    monkeypatch.setenv("MASC_ENGINE_CACHE", str(root))
    out = CliRunner().invoke(main, ["info"]).output
    assert f"cache root: {root}  (from MASC_ENGINE_CACHE)" in out
    assert "not masc-engine's (not sized; masc-cache clean refuses this root): notes.txt" in out
    monkeypatch.setenv("MASC_ENGINE_CACHE", str(root / "random-models" / "m"))
    assert "(not a folder)" in CliRunner().invoke(main, ["info"]).output
    link = tmp_path / "link"
    os.symlink(root, link)
    monkeypatch.setenv("MASC_ENGINE_CACHE", str(link))
    out = CliRunner().invoke(main, ["info"]).output
    assert "(a symbolic link: not followed)" in out and "total:" in out and "(0 bytes)" in out
