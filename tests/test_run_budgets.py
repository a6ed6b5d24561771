"""masc-run's budgets before work: a prompt or object name over its byte or token budget, a file
over its byte cap, or a path the operating system refuses is that row's status; the rest of the
pairs file is scored, whatever its format."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from support import EXAMPLES, REPO
from PIL import Image

from masc_engine.cli.run_cmd import main as run_main
from masc_engine.errors import InputError
from masc_engine.jobs.results import read_output
from masc_engine.jobs.tables import write_table
from masc_engine.runtime import io as rio
from masc_engine.runtime.text import (
    DEFAULT_MAX_PROMPT_BYTES,
    DEFAULT_MAX_PROMPT_TOKENS,
    PreparedPrompt,
    PromptBudget,
    PromptTokenizer,
    TextSettings,
)

COLUMNS = ["key", "ref_image", "ref_mask", "out_image", "out_mask", "prompt", "object_name"]
GOOD = {
    "ref_image": "cat0.jpg",
    "ref_mask": "cat0.png",
    "out_image": "cat1.jpg",
    "out_mask": "cat1.png",
    "prompt": "a cat on the beach",
    "object_name": "cat",
}
FORMATS = ["csv", "jsonl", "json", "parquet"]


@pytest.fixture()
def data(tmp_path) -> Path:
    """Two cat photos (62 KB and 51 KB JPEGs) and their masks."""
    for i in (0, 1):
        shutil.copy(EXAMPLES / f"images/cat/0{i}.jpg", tmp_path / f"cat{i}.jpg")
        shutil.copy(EXAMPLES / f"masks/cat/0{i}.png", tmp_path / f"cat{i}.png")
    return tmp_path


def _pairs(folder: Path, rows: list[dict], fmt: str = "csv") -> Path:
    return write_table(folder / f"pairs.{fmt}", [{**GOOD, **r} for r in rows], COLUMNS)


def _run(pairs: Path, bundle: Path, *args: str) -> tuple[object, dict]:
    out = pairs.parent / "out.csv"
    res = CliRunner().invoke(run_main, [str(pairs), "--bundle", str(bundle), "--out", str(out), "--no-progress", *args])
    rows = {r["key"]: r for r in read_output(out)} if res.exit_code == 0 else {}
    return res, rows


def _num(v) -> float:
    return float("nan") if v in (None, "") else float(v)  # JSON Lines writes NaN as null


def _scored(row: dict) -> bool:
    return row["status"] == "ok" and math.isfinite(_num(row["cp"])) and math.isfinite(_num(row["pf"]))


def _refused(row: dict, status: str) -> bool:
    return (
        row["status"] == row["cp_status"] == row["pf_status"] == status
        and math.isnan(_num(row["cp"]))
        and math.isnan(_num(row["pf"]))
    )


@pytest.mark.parametrize("fmt", FORMATS)
def test_text_over_the_byte_budget_is_its_rows_status_in_every_format(naflex_bundle, data, fmt):
    """The service's budget (4,096 UTF-8 bytes, counted in bytes: 2,049 'é' are 4,098 bytes) for
    the prompt and the object name; the rows around them are scored."""
    long_prompt = "é" * (DEFAULT_MAX_PROMPT_BYTES // 2 + 1)
    long_name = "c" * (DEFAULT_MAX_PROMPT_BYTES + 1)
    pairs = _pairs(
        data,
        [
            {"key": "good1"},
            {"key": "prompt", "prompt": long_prompt},
            {"key": "name", "object_name": long_name},
            {"key": "good2"},
        ],
        fmt,
    )
    res, rows = _run(pairs, naflex_bundle, "--chunk-size", "2")
    assert res.exit_code == 0, res.output
    assert _scored(rows["good1"]) and _scored(rows["good2"])
    assert _refused(rows["prompt"], "prompt_too_long") and _refused(rows["name"], "object_name_too_long")
    assert rows["prompt"]["status_detail"] == "prompt: 4098 bytes, over the budget of 4096 bytes (--max-prompt-bytes)"
    assert rows["name"]["status_detail"].startswith("object_name: 4097 characters, over the budget of 4096 bytes")
    assert rows["prompt"]["prompt"] == long_prompt  # carried through unchanged
    assert "prompt_too_long: 1" in res.output and "object_name_too_long: 1" in res.output


def test_csv_cell_over_pythons_field_limit_is_its_rows_status(naflex_bundle, data):
    """A 200,000-character cell (Python's csv module refuses fields over 131,072 by default) is the
    row's ``prompt_too_long``, not a refusal of the whole file."""
    pairs = _pairs(data, [{"key": "good1"}, {"key": "huge", "prompt": "a" * 200_000}, {"key": "good2"}])
    res, rows = _run(pairs, naflex_bundle)
    assert res.exit_code == 0, res.output
    assert _scored(rows["good1"]) and _scored(rows["good2"]) and _refused(rows["huge"], "prompt_too_long")
    assert len(rows["huge"]["prompt"]) == 200_000


@pytest.mark.slow
def test_fifty_megabyte_prompt_in_jsonl_is_one_row_status(naflex_bundle, data, tmp_path):
    """A 50 MB prompt cell never reaches the tokenizer (which aborted the process on it): run in a
    child process, so that an abort is a failed assertion here."""
    pairs = _pairs(
        data,
        [{"key": "good1"}, {"key": "huge", "prompt": "on the sand " * (50 * 2**20 // 12)}, {"key": "good2"}],
        "jsonl",
    )
    assert pairs.stat().st_size > 50 * 2**20
    out = tmp_path / "out.jsonl"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    code = "import sys; from masc_engine.cli.run_cmd import main; sys.exit(main())"
    proc = subprocess.run(
        [sys.executable, "-c", code, str(pairs), "--bundle", str(naflex_bundle), "--out", str(out), "--no-progress"],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {r["key"]: r for r in read_output(out)}
    assert _scored(rows["good1"]) and _scored(rows["good2"]) and _refused(rows["huge"], "prompt_too_long")


def test_token_budgets_and_their_options(naflex_bundle, data):
    """--max-prompt-tokens counts the stripped prompt's tokens and the object name's; both options
    default to masc-serve's budgets (one home: runtime/text.py)."""
    opts = {p.name: p for p in run_main.params}
    assert opts["max_prompt_bytes"].default == DEFAULT_MAX_PROMPT_BYTES
    assert opts["max_prompt_tokens"].default == DEFAULT_MAX_PROMPT_TOKENS
    pairs = _pairs(
        data,
        [
            {"key": "short", "prompt": "a cat"},
            {"key": "many", "prompt": "a cat sitting on the warm sand of a beach at dusk"},
            {"key": "name", "prompt": "a cat", "object_name": "fluffy orange tabby cat with a hat"},
            {"key": "bytes", "prompt": "a cat on the sand"},
        ],
    )
    res, rows = _run(pairs, naflex_bundle, "--max-prompt-tokens", "6")  # the tiny tokenizer: "on the sand" is 5
    assert res.exit_code == 0, res.output
    assert _scored(rows["short"]) and _scored(rows["bytes"])
    assert _refused(rows["many"], "prompt_too_long")
    assert rows["many"]["status_detail"].endswith("tokens, over the budget of 6 tokens (--max-prompt-tokens)")
    assert _refused(rows["name"], "object_name_too_long")
    assert (
        rows["name"]["status_detail"].startswith("object_name: ")
        and "over the budget of 6 tokens" in rows["name"]["status_detail"]
    )
    res, rows = _run(pairs, naflex_bundle, "--max-prompt-bytes", "16", "--overwrite")
    assert res.exit_code == 0, res.output
    assert _scored(rows["short"])
    assert _refused(rows["bytes"], "prompt_too_long") and "prompt: 17 characters" in rows["bytes"]["status_detail"]
    assert (
        _refused(rows["name"], "object_name_too_long") and "object_name: 34 characters" in rows["name"]["status_detail"]
    )


def test_name_tokens_are_counted(naflex_bundle, data):
    pairs = _pairs(data, [{"key": "name", "prompt": "a", "object_name": "fluffy orange tabby"}])
    res, rows = _run(pairs, naflex_bundle, "--max-prompt-tokens", "2")
    assert res.exit_code == 0, res.output
    assert _refused(rows["name"], "object_name_too_long")
    assert "tokens, over the budget of 2 tokens" in rows["name"]["status_detail"]


def test_a_prompt_of_exactly_the_token_budget_passes_and_one_token_more_is_refused(naflex_bundle):
    """The token budget at its edge (runtime/text.py ``PromptBudget.check_tokens``): a prompt of
    exactly ``max_tokens`` tokens (the bundle tokenizer's count) passes, one of ``max_tokens + 1``
    is refused naming both figures."""
    text = json.loads((naflex_bundle / "manifest.json").read_text())["text"]
    tok = PromptTokenizer(naflex_bundle / text["tokenizer_file"], TextSettings.from_manifest(text))
    prompt = "a cat on the sand"
    enc = tok.encode([prompt])[0]
    prepared = PreparedPrompt(prompt, {}, enc)
    n = enc.n_tokens
    assert n > 2
    PromptBudget(max_tokens=n).check_tokens(prepared, "prompt")
    with pytest.raises(InputError) as e:
        PromptBudget(max_tokens=n - 1).check_tokens(prepared, "prompt")
    assert e.value.reason == "prompt_too_long"
    assert e.value.detail == f"prompt: {n} tokens, over the budget of {n - 1} tokens"


def test_a_budget_change_is_a_settings_change(naflex_bundle, data):
    """A row's status depends on the budgets: a rerun with another budget does not reuse results
    made under the first (the run stops, naming the option), and a default run keeps the
    fingerprint runs without these options had."""
    pairs = _pairs(data, [{"key": "good1"}])
    res, _ = _run(pairs, naflex_bundle)
    assert res.exit_code == 0, res.output
    meta = json.loads((data / "out.csv.meta.json").read_text())
    assert not {"max_prompt_bytes", "max_prompt_tokens", "max_file_bytes"} & set(meta["settings"])
    res, _ = _run(pairs, naflex_bundle, "--max-prompt-bytes", "10")
    assert res.exit_code == 1 and "--max-prompt-bytes: unset -> 10" in res.output


def _noise_png(path: Path, side: int) -> None:
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8)).save(path)


def test_file_over_the_byte_cap_is_its_rows_status(naflex_bundle, data):
    """--max-file-mb: a 480 KB image over a 0.25 MiB cap is refused from its size, before it is read."""
    _noise_png(data / "big.png", 400)
    Image.fromarray(np.repeat([255, 0], 200)[:, None].repeat(400, 1).astype(np.uint8)).save(data / "big_mask.png")
    assert (data / "big.png").stat().st_size > 2**18
    pairs = _pairs(
        data,
        [
            {"key": "good1"},
            {"key": "big", "out_image": "big.png", "out_mask": "big_mask.png"},
            {"key": "bigref", "ref_image": "big.png", "ref_mask": "big_mask.png"},
            {"key": "good2"},
        ],
    )
    res, rows = _run(pairs, naflex_bundle, "--max-file-mb", "0.25")
    assert res.exit_code == 0, res.output
    assert _scored(rows["good1"]) and _scored(rows["good2"])
    for key, col in (("big", "out_image"), ("bigref", "ref_image")):
        assert _refused(rows[key], "file_too_large")
        detail = rows[key]["status_detail"]
        assert detail.startswith(f"{col}: ") and "big.png" in detail and "over the cap of 262144 bytes" in detail
    res, rows = _run(pairs, naflex_bundle, "--max-file-mb", "1", "--overwrite")
    assert res.exit_code == 0 and _scored(rows["big"]), res.output


def test_default_file_cap_follows_the_pixel_budget(naflex_bundle, data):
    """The default cap is 4 bytes a pixel of Pillow's pixel budget plus 16 MiB; a (sparse) file one
    byte over it is refused from its size, without being read."""
    cap = rio.default_max_file_bytes()
    assert cap == 4 * Image.MAX_IMAGE_PIXELS + 16 * 2**20
    assert rio.default_max_file_bytes(1000) == 4000 + 16 * 2**20
    with open(data / "sparse.png", "wb") as f:
        f.truncate(cap + 1)
    pairs = _pairs(data, [{"key": "good1"}, {"key": "sparse", "out_image": "sparse.png"}])
    res, rows = _run(pairs, naflex_bundle)
    assert res.exit_code == 0, res.output
    assert _scored(rows["good1"]) and _refused(rows["sparse"], "file_too_large")


def test_read_bytes_reads_at_most_the_cap(tmp_path, monkeypatch):
    """A file that grows between its size check and its read is cut at cap + 1 bytes and refused;
    a file of exactly the cap is read whole."""
    p = tmp_path / "f.png"
    p.write_bytes(b"x" * 100)
    assert rio.read_bytes(str(p), "image", max_bytes=100) == b"x" * 100
    with pytest.raises(InputError) as e:
        rio.read_bytes(str(p), "image", max_bytes=99)
    assert e.value.reason == "file_too_large" and "100 bytes" in e.value.detail
    real_stat, real_fstat = os.stat, os.fstat

    def small(st):  # the size it had when checked
        return os.stat_result(
            (
                st.st_mode,
                st.st_ino,
                st.st_dev,
                st.st_nlink,
                st.st_uid,
                st.st_gid,
                10,
                st.st_atime,
                st.st_mtime,
                st.st_ctime,
            )
        )

    monkeypatch.setattr(rio.os, "stat", lambda path: small(real_stat(path)))
    monkeypatch.setattr(rio.os, "fstat", lambda fd: small(real_fstat(fd)))
    # What the read hands over is counted: a file that grew is read only to cap + 1 bytes, so a
    # file growing without end costs cap + 1 bytes of memory, not its size.
    handed = []
    real_fdopen = rio.os.fdopen

    class Counted:
        def __init__(self, f):
            self._f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self._f.close()

        def read(self, n=-1):
            data = self._f.read(n)
            handed.append(len(data))
            return data

    monkeypatch.setattr(rio.os, "fdopen", lambda fd, mode: Counted(real_fdopen(fd, mode)))
    with pytest.raises(InputError) as e:
        rio.read_bytes(str(p), "image", max_bytes=50)
    assert e.value.reason == "file_too_large" and "more than 50 bytes" in e.value.detail
    assert sum(handed) == 51, handed


def test_not_a_regular_file_is_unreadable():
    with pytest.raises(InputError) as e:
        rio.read_bytes("/dev/zero", "image", max_bytes=100)
    assert e.value.reason == "unreadable_image" and "not a regular file" in e.value.detail


def test_paths_the_os_refuses_are_their_rows_status(naflex_bundle, data):
    """A NUL byte or a file name longer than the file system allows is the row's ``bad_path``,
    naming the column; the run goes on."""
    pairs = _pairs(
        data,
        [
            {"key": "good1"},
            {"key": "nul", "out_mask": "cat1\x00.png"},
            {"key": "long", "ref_image": "x" * 300 + ".jpg"},
            {"key": "good2"},
        ],
        "jsonl",
    )
    res, rows = _run(pairs, naflex_bundle)
    assert res.exit_code == 0, res.output
    assert _scored(rows["good1"]) and _scored(rows["good2"])
    assert _refused(rows["nul"], "bad_path") and rows["nul"]["status_detail"].startswith("out_mask: ")
    assert "NUL" in rows["nul"]["status_detail"]
    assert _refused(rows["long"], "bad_path") and rows["long"]["status_detail"].startswith("ref_image: ")


def test_pairs_file_over_its_byte_budget_is_one_line(naflex_bundle, data):
    pairs = _pairs(data, [{"key": f"r{i}"} for i in range(20)])
    assert pairs.stat().st_size > 1100
    res, _ = _run(pairs, naflex_bundle, "--max-pairs-mb", "0.001")
    assert res.exit_code == 1
    lines = [ln for ln in res.output.strip().splitlines() if not ln.startswith("WARNING: ")]  # random weights
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "--max-pairs-mb" in lines[0], res.output


@pytest.mark.parametrize(
    "name, body, cause",
    [
        (
            "surrogate",
            '{"key": "a", "prompt": "a cat"}\n{"key": "b", "prompt": "a \\ud800 cat"}\n',
            "line 2: a string holds a lone UTF-16 surrogate ('\\ud800'), not text",
        ),
        (
            "deep",
            '{"key": "a"}\n{"key": ' + "[" * 100_000 + "]" * 100_000 + "}\n",
            "line 2: invalid JSON (nested too deeply)",
        ),
        ("not_utf8", '{"key": "a"}\n{"key": "\xff"}\n', "line 2: not UTF-8 text"),
    ],
)
def test_jsonl_that_is_not_text_is_one_line(naflex_bundle, tmp_path, name, body, cause):
    """A lone surrogate escape (no UTF-8 output could hold it), nesting past Python's recursion
    limit, or bytes that are not UTF-8: one line naming the file and the line, nothing written."""
    pairs = tmp_path / f"{name}.jsonl"
    pairs.write_bytes(body.encode("utf-8", "surrogateescape") if name != "not_utf8" else body.encode("latin-1"))
    res = CliRunner().invoke(
        run_main, [str(pairs), "--bundle", str(naflex_bundle), "--out", str(tmp_path / "o.csv"), "--no-progress"]
    )
    lines = [ln for ln in res.output.strip().splitlines() if not ln.startswith("WARNING: ")]
    assert res.exit_code == 1 and len(lines) == 1, res.output[-3000:]
    assert lines[0] == f"Error: bad_pairs_file: {pairs}, {cause}" or lines[0].startswith(
        f"Error: bad_pairs_file: {pairs}, {cause}"
    ), lines[0]
    assert not (tmp_path / "o.csv").exists()


def test_masc_rank_nul_byte_in_a_path_cell_is_that_querys_status(tmp_path):
    """masc-rank reads its tables through the same path rules: a NUL byte is the query's
    ``bad_path`` naming the column (it stopped the run with "embedded null byte" before)."""
    from test_rank import _manifest, _solid, _tiny_encoder, _write_csv

    from masc_engine.cli.rank_cmd import main as rank_main

    for name, rgb in (("red", (255, 0, 0)), ("blue", (0, 0, 255)), ("orange", (255, 128, 0))):
        _solid(tmp_path / f"{name}.png", rgb)
    _write_csv(
        tmp_path / "gallery.csv",
        ["image", "identity"],
        [{"image": "red.png", "identity": "A"}, {"image": "blue.png", "identity": "B"}],
    )
    _write_csv(
        tmp_path / "queries.csv",
        ["key", "image", "identity", "method"],
        [
            {"key": "q1", "image": "orange.png", "identity": "A", "method": "m"},
            {"key": "nul", "image": "orange\x00.png", "identity": "A", "method": "m"},
        ],
    )
    _tiny_encoder(tmp_path)
    out = tmp_path / "r.csv"
    res = CliRunner().invoke(
        rank_main,
        [
            str(tmp_path / "queries.csv"),
            "--gallery",
            str(tmp_path / "gallery.csv"),
            "--encoder-manifest",
            str(_manifest(tmp_path)),
            "--out",
            str(out),
            "--no-progress",
        ],
    )
    assert res.exit_code == 0, res.output
    rows = {r["key"]: r for r in _csv_rows(out)}
    assert rows["q1"]["status"] == "ok"
    assert rows["nul"]["status"] == "bad_path" and rows["nul"]["status_detail"].startswith("image: ")


def _csv_rows(path: Path) -> list[dict]:
    import csv

    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))
