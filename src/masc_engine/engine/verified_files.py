"""Graph files already hashed: a cold process skips the sha256 of a file that has not changed.

A bundle's files are checked against their manifest sha256 before first use (engine/bundle.py).
Hashing the graphs of a base bundle and two embedders reads ~2 GB per process; when a file's
hash matched, a record of its identity is kept under the cache root (``runtime/verified/``,
engine/cache_root.py), and a later process that finds the same file unchanged takes the match as
known. "Unchanged" is the file's device, inode, size, modification time and status-change time
(``st_ctime_ns``), all in nanoseconds: writing to the file, replacing it (a new inode) or resetting
its modification time (which sets ``st_ctime`` to now; no call sets it back) each change the
record's key, and the file is hashed again. The record also holds the digest it matched, so a
manifest that lists another digest never matches a record.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path
from typing import Any

from .cache_root import RUNTIME, cache_root

#: Subfolder of the cache root's :data:`~masc_engine.engine.cache_root.RUNTIME` holding the records.
VERIFIED = "verified"

#: The largest record read, in bytes: a record is ~250 bytes (path, digest, five integers); a larger
#: file, a link or anything but a regular file under the cache root is not read (not known).
MAX_RECORD_BYTES = 4096


def stat_key(path: str | Path) -> list[int]:
    """``[st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns]`` of ``path`` (following links).

    Raises:
        OSError: the file cannot be stat'ed.
    """
    st = os.stat(path)
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def record_path(path: str | Path) -> Path:
    """Where the record of ``path`` (by its resolved absolute path) lives under the cache root."""
    name = hashlib.sha256(str(Path(path).resolve()).encode()).hexdigest()[:32]
    return cache_root() / RUNTIME / VERIFIED / f"{name}.json"


def known(path: str | Path, digest: str) -> bool:
    """Whether ``path`` was hashed to ``digest`` (hex sha256) by an earlier process and has not
    changed since (:func:`stat_key`). Any unreadable or malformed record is "not known"."""
    try:
        rec = _read_record(record_path(path))
        return bool(rec is not None and rec.get("sha256") == digest and rec.get("key") == stat_key(path))
    except (OSError, ValueError, AttributeError):
        return False


def _read_record(target: Path) -> Any:
    """The JSON of a record file, or None when it is not a regular file of at most
    :data:`MAX_RECORD_BYTES` (checked on the open descriptor, before reading; links are not
    followed and a FIFO does not block the open)."""
    fd = os.open(target, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_RECORD_BYTES:
            return None
        return json.loads(os.read(fd, MAX_RECORD_BYTES + 1))
    finally:
        os.close(fd)


def remember(path: str | Path, digest: str) -> bool:
    """Record that ``path`` hashed to ``digest`` now (written atomically); False when the cache
    root cannot be written (the next process then hashes again)."""
    try:
        target = record_path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"path": str(Path(path).resolve()), "sha256": digest, "key": stat_key(path)}))
        os.replace(tmp, target)
    except OSError:
        return False
    return True
