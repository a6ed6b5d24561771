"""masc-cache and the cache root: the rule that picks the root, exact sizes, cleaning only what was
asked inside the root without following links, dry runs, and the one-line refusals."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from masc_engine.cli.cache_cmd import main
from masc_engine.engine.cache_root import cache_root, human_bytes, tree_bytes


def _write(path: Path, n: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * n)
    return path


@pytest.fixture
def root(tmp_path, monkeypatch) -> Path:
    """A cache root with 1,000 + 2,500 bytes of checkpoints and 700 of TensorRT timing cache."""
    r = tmp_path / "cache"
    _write(r / "random-models" / "tiny-naflex-tfX" / "model.safetensors", 1000)
    _write(r / "random-models" / "tiny-naflex-tfX" / "sub" / "config.json", 2500)
    _write(r / "tensorrt" / "timing-trt10-sm90.cache", 700)
    monkeypatch.setenv("MASC_ENGINE_CACHE", str(r))
    return r


def _run(*args: str):
    return CliRunner().invoke(main, list(args))


def _bytes(output: str, label: str) -> int:
    m = re.search(rf"^{re.escape(label)}:\s.*\(([\d,]+) bytes\)", output, re.M)
    assert m, output
    return int(m.group(1).replace(",", ""))


def test_root_rule(monkeypatch, tmp_path):
    monkeypatch.setenv("MASC_ENGINE_CACHE", str(tmp_path / "own"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "own"
    monkeypatch.setenv("MASC_ENGINE_CACHE", "")
    assert cache_root() == tmp_path / "xdg" / "masc-engine"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/xdg")  # the XDG rule: a relative value is ignored
    assert cache_root() == Path.home() / ".cache" / "masc-engine"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.delenv("MASC_ENGINE_CACHE")
    assert cache_root() == Path.home() / ".cache" / "masc-engine"


def test_info_sizes_exact(root):
    before = sorted(p for p in root.rglob("*"))
    res = _run("info")
    assert res.exit_code == 0, res.output
    assert f"cache root: {root}  (from MASC_ENGINE_CACHE)" in res.output
    assert _bytes(res.output, "random-models") == 3500
    assert _bytes(res.output, "tensorrt") == 700
    assert _bytes(res.output, "total") == 4200
    assert "3.4 KiB" in res.output and "700 B" in res.output
    assert sorted(p for p in root.rglob("*")) == before  # info writes nothing


def test_info_absent_root(tmp_path, monkeypatch):
    monkeypatch.setenv("MASC_ENGINE_CACHE", str(tmp_path / "never"))
    res = _run("info")
    assert res.exit_code == 0 and "not created yet" in res.output and _bytes(res.output, "total") == 0
    assert not (tmp_path / "never").exists()


def test_human_bytes():
    assert [human_bytes(n) for n in (0, 1023, 1024, 3_650_722_201, 5 * 2**40)] == [
        "0 B",
        "1023 B",
        "1.0 KiB",
        "3.4 GiB",
        "5.0 TiB",
    ]


def test_human_bytes_never_prints_1024_of_a_unit():
    # Just under a unit boundary, the value rounds up to the next unit instead of "1024.0 KiB".
    assert [human_bytes(n) for n in (2**20 - 1, 2**20 - 52, 2**30 - 1)] == ["1.0 MiB", "1023.9 KiB", "1.0 GiB"]


def test_clean_removes_only_the_asked_subfolder(root):
    res = _run("clean", "--tensorrt")
    assert res.exit_code == 0, res.output
    assert not (root / "tensorrt").exists()
    assert tree_bytes(root / "random-models") == 3500
    assert f"removed {root / 'tensorrt'}" in res.output and "freed 700 B (700 bytes)" in res.output
    res = _run("clean", "--checkpoints")
    assert res.exit_code == 0 and "freed 3.4 KiB (3,500 bytes)" in res.output
    assert sorted(os.listdir(root)) == []
    res = _run("clean", "--all")
    assert res.exit_code == 0 and "nothing to remove" in res.output and "freed 0 B" in res.output


def test_dry_run_removes_nothing(root):
    res = _run("clean", "--all", "--dry-run")
    assert res.exit_code == 0, res.output
    assert "would remove" in res.output and "would free 4.1 KiB (4,200 bytes)" in res.output
    assert tree_bytes(root / "random-models") == 3500 and tree_bytes(root / "tensorrt") == 700


def test_links_out_of_the_root_are_not_followed(root, tmp_path):
    outside = tmp_path / "precious"
    _write(outside / "keep.bin", 5000)
    os.symlink(outside, root / "random-models" / "link-out")
    os.symlink(outside / "keep.bin", root / "tensorrt" / "file-link-out")
    res = _run("info")
    assert _bytes(res.output, "total") == 4200  # links are not sized
    res = _run("clean", "--all")
    assert res.exit_code == 0, res.output
    assert (outside / "keep.bin").read_bytes() == b"x" * 5000
    assert "freed 4.1 KiB (4,200 bytes)" in res.output
    assert os.listdir(root) == []


def test_a_linked_subfolder_is_unlinked_not_emptied(root, tmp_path):
    elsewhere = _write(tmp_path / "elsewhere" / "timing.cache", 300).parent
    shutil.rmtree(root / "tensorrt")
    os.symlink(elsewhere, root / "tensorrt")
    res = _run("clean", "--tensorrt")
    assert res.exit_code == 0, res.output
    assert not os.path.lexists(root / "tensorrt") and (elsewhere / "timing.cache").stat().st_size == 300


@pytest.mark.parametrize("case", ["symlink", "slash", "home", "foreign", "file"])
def test_refusals(case, tmp_path, monkeypatch):
    real = tmp_path / "real"
    _write(real / "random-models" / "m.bin", 10)
    target = {
        "symlink": tmp_path / "link",
        "slash": Path("/"),
        "home": Path.home(),
        "foreign": real,
        "file": tmp_path / "afile",
    }[case]
    if case == "symlink":
        os.symlink(real, target)
    elif case == "foreign":
        _write(real / "notes.txt", 3)
    elif case == "file":
        _write(target, 3)
    monkeypatch.setenv("MASC_ENGINE_CACHE", str(target))
    res = _run("clean", "--all")
    assert res.exit_code == 1
    assert res.output.count("\n") == 1 and res.output.startswith("Error: cache root ")
    assert "refusing" in res.output and "Traceback" not in res.output
    assert (real / "random-models" / "m.bin").stat().st_size == 10


def test_clean_needs_a_choice(root):
    res = _run("clean")
    assert res.exit_code == 2 and "Error: name what to remove: --checkpoints, --tensorrt or --all" in res.output
    assert tree_bytes(root) == 4200
