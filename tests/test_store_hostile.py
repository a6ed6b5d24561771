"""Hostile files in the folders masc-run reads: a ``--cache-dir`` whose entries were planted (a
pickle that runs code when loaded, values of another type or shape, a value file pointing outside
the store) is never unpickled, its entries are misses and the run scores every row; a journal or
sidecar that is a symbolic link is refused in one line and its target is left as it was; a
journal or sidecar nested too deep to parse is the corrupt-sidecar case, not a traceback."""

from __future__ import annotations

import csv
import logging
import sqlite3
import struct
import subprocess
import sys

import diskcache
import numpy as np
import pytest

from support import EXAMPLES
from masc_engine.jobs.results import SidecarError, read_journal, read_meta
from masc_engine.runtime.cache import EncodingStore
from masc_engine.runtime.scorer import ImageEncoding

RUN = [sys.executable, "-m", "masc_engine.cli.run_cmd"]
REFUSED = "is not in this store's format"


class _Payload:
    """Creates ``marker`` when unpickled (what a planted pickle could do)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _plant(folder, keys, marker) -> None:
    """Overwrite ``keys`` with pickles through diskcache's default Disk: small ones inline in
    the SQLite value column, large ones (padded past the file threshold) as ``.val`` files."""
    with diskcache.Cache(str(folder)) as c:
        for i, k in enumerate(keys):
            c.set(k, _Payload(marker) if i % 2 else (_Payload(marker), b"x" * 100_000))


def _store(folder) -> EncodingStore:
    return EncodingStore(folder, {"bundle": "b"})


def _enc(n=6, d=5):
    return ImageEncoding(np.arange(n * d, dtype=np.float32).reshape(n, d), (2, n // 2))


def test_planted_pickles_never_run_and_are_misses(tmp_path, caplog):
    folder, marker = tmp_path / "cache", tmp_path / "PWNED"
    s = _store(folder)
    for k in "abcd":
        s.put_image(k, _enc())
    s.put_text("a cat", np.ones(4, np.float32))
    s.put_mask("m", np.full((3, 5), 255, np.uint8))
    keys = [s._key("img", k) for k in "abcd"] + [s._key("txt", _sha("a cat")), s._mask_key("m", "")]
    s.close()
    _plant(folder, keys, marker)
    s = _store(folder)
    with caplog.at_level(logging.WARNING, logger="masc_engine.cache"):
        got = [s.get_image(k) for k in "abcd"] + [s.get_text("a cat"), s.get_mask("m")]
    assert got == [None] * 6 and not marker.exists()
    assert (s.refused, s.misses, s.hits, s.fault) == (6, 4, 0, None)
    assert [r.getMessage() for r in caplog.records].__len__() == 1 and REFUSED in caplog.records[0].getMessage()
    s.put_image("a", _enc())  # the refused entry is rewritten in the store's format
    assert np.array_equal(s.get_image("a").tokens, _enc().tokens) and s.get_image("a").grid == (2, 3)


def _sha(text):
    from masc_engine.runtime.cache import sha256_bytes

    return sha256_bytes(text.encode())


def _head(kind: bytes, dims) -> bytes:
    return b"masc-store/1\n" + kind + struct.pack(f"<B{len(dims)}Q", len(dims), *dims)


@pytest.mark.parametrize(
    "value",
    [
        b"",
        b"garbage",
        "a string",
        12345,
        1.5,
        _head(b"img", (6, 5, 2, 3)) + b"\0" * (4 * 30 - 4),  # a payload shorter than its dimensions
        _head(b"img", (6, 5, 4, 4)) + b"\0" * (4 * 30),  # tokens that are not the grid's patches
        _head(b"txt", (30,)) + b"\0" * (4 * 30),  # another kind under an image key
        _head(b"img", (6, 5, 2)) + b"\0" * (4 * 30),  # a dimension missing
    ],
)
def test_a_value_of_another_type_or_shape_is_a_miss(tmp_path, value):
    s = _store(tmp_path / "cache")
    s.put_image("a", _enc())
    with diskcache.Cache(str(tmp_path / "cache")) as c:
        c.set(s._key("img", "a"), value)
    assert s.get_image("a") is None and s.refused == 1 and s.fault is None


def test_an_entry_of_another_width_is_a_miss(naflex_bundle, tmp_path):
    """A well-formed entry whose token or embedding width is not the bundle's: a miss, and the
    scorer encodes afresh (a planted [N, D+1] entry would otherwise break the batch)."""
    from masc_engine.runtime.cache import EncodingCache
    from masc_engine.runtime.scorer import Scorer

    scorer = Scorer(naflex_bundle)
    s = _store(tmp_path / "cache")
    EncodingCache(scorer, store=s)
    d = s.widths["img"]
    assert d == 64 and s.widths["txt"] == 64
    s.put_image("a", _enc(6, d + 1))
    s.put_text("a cat", np.ones(s.widths["txt"] + 1, np.float32))
    assert s.get_image("a") is None and s.get_text("a cat") is None and s.refused == 2
    s.put_image("a", _enc(6, d))
    assert s.get_image("a").tokens.shape == (6, d)


def test_a_value_file_outside_the_store_is_neither_read_nor_deleted(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(_head(b"img", (6, 5, 2, 3)) + b"\0" * 120)  # a valid entry, outside the store
    s = _store(tmp_path / "cache")
    s.put_image("a", _enc())
    with sqlite3.connect(tmp_path / "cache" / "cache.db") as db:
        db.execute(
            "UPDATE Cache SET mode = 2, filename = ?, value = NULL WHERE key = ?", ("../victim", s._key("img", "a"))
        )
    assert s.get_image("a") is None and s.refused == 1
    s.put_image("a", _enc())  # replacing the row removes its old file: never one outside the store
    assert victim.read_bytes() == _head(b"img", (6, 5, 2, 3)) + b"\0" * 120
    assert s.get_image("a").grid == (2, 3)


def _scores(path) -> dict:
    return {r["row_index"]: (r["status"], r["cp"], r["pf"]) for r in csv.DictReader(open(path, encoding="utf-8"))}


def _masc_run(bundle, out, *extra):
    return subprocess.run(
        [*RUN, str(EXAMPLES / "pairs.csv"), "--bundle", str(bundle), "--out", str(out), "--no-progress", *extra],
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.slow
def test_masc_run_scores_every_row_through_a_planted_cache(naflex_bundle, tmp_path):
    cache, marker = tmp_path / "cache", tmp_path / "PWNED"
    cold = _masc_run(naflex_bundle, tmp_path / "cold.csv", "--cache-dir", str(cache))
    assert cold.returncode == 0, cold.stderr
    with diskcache.Cache(str(cache)) as c:
        keys = [k for k in c.iterkeys() if k != "masc:probe"]
    assert len(keys) > 10
    _plant(cache, keys, marker)
    warm = _masc_run(naflex_bundle, tmp_path / "warm.csv", "--cache-dir", str(cache))
    assert warm.returncode == 0, warm.stderr
    assert not marker.exists()
    assert warm.stderr.count(REFUSED) == 1 and "Traceback" not in warm.stderr, warm.stderr
    assert _scores(tmp_path / "warm.csv") == _scores(tmp_path / "cold.csv")
    assert all(st == "ok" for st, _, _ in _scores(tmp_path / "warm.csv").values())


# ---------------------------------------------------------------------- journal and sidecar


@pytest.mark.parametrize("sidecar", [".journal.jsonl", ".meta.json"])
@pytest.mark.slow
def test_a_symlinked_journal_or_sidecar_is_refused_and_its_target_kept(naflex_bundle, tmp_path, sidecar):
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b'{"type": "header"}\nprecious bytes, no newline')  # a torn last line to "repair"
    out = tmp_path / "o.csv"
    link = tmp_path / ("o.csv" + sidecar)
    link.symlink_to(victim)
    r = _masc_run(naflex_bundle, out)
    err = [ln for ln in r.stderr.splitlines() if ln.strip() and "exported from random weights" not in ln]
    assert r.returncode == 1 and len(err) == 1, r.stderr
    assert err[0].startswith("Error: the ") and f"{link} is a symbolic link" in err[0], err
    assert victim.read_bytes() == b'{"type": "header"}\nprecious bytes, no newline'
    assert link.is_symlink() and not out.exists()


@pytest.mark.slow
def test_a_symlinked_temporary_sidecar_is_not_written_through(naflex_bundle, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious")
    (tmp_path / "o.csv.meta.json.partial").symlink_to(victim)
    r = _masc_run(naflex_bundle, tmp_path / "o.csv")
    assert r.returncode == 0, r.stderr
    assert victim.read_bytes() == b"precious"
    assert read_meta(tmp_path / "o.csv")["fingerprint"]


def test_a_fifo_journal_is_refused(tmp_path):
    import os

    os.mkfifo(tmp_path / "o.csv.journal.jsonl")
    with pytest.raises(SidecarError, match="is not a regular file"):
        read_journal(tmp_path / "o.csv.journal.jsonl")


def test_deeply_nested_sidecars_are_the_corrupt_case(tmp_path):
    out = tmp_path / "o.csv"
    (tmp_path / "o.csv.meta.json").write_text("[" * 100_000)
    assert read_meta(out) is None
    jp = tmp_path / "o.csv.journal.jsonl"
    jp.write_text('{"type": "header", "fingerprint": "f"}\n' + "[" * 100_000 + "\n")
    header, entries, repaired = read_journal(jp)
    assert header["fingerprint"] == "f" and entries == [] and repaired
    assert jp.read_text() == '{"type": "header", "fingerprint": "f"}\n'
    jp.write_text('{"type": "header"}\n' + "[" * 100_000 + '\n{"row_index": 1}\n')
    with pytest.raises(ValueError, match="line 2 is not JSON"):
        read_journal(jp)


def test_a_huge_sidecar_is_not_read_whole(tmp_path):
    meta = tmp_path / "o.csv.meta.json"
    with open(meta, "wb") as f:
        f.write(b'{"fingerprint": "f"')
        f.truncate(200 * 2**20)  # sparse: 200 MiB of NULs, never on disk
    assert read_meta(tmp_path / "o.csv") is None
