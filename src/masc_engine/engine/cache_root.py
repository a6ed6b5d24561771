"""The one folder masc-engine writes to outside the paths a user names.

Everything masc-engine keeps between runs without being told where lives under :func:`cache_root`,
one subfolder per kind (:data:`SUBFOLDERS`): the random-weight checkpoints that
``masc-export --model random:<preset>`` builds for tests and demos (``random-models/``, 3.4 GB for
``random:so400m``), the TensorRT timing cache (``tensorrt/``) and what a cold process reuses to
start faster (``runtime/``: OpenVINO's compiled models, records of graph files already hashed). ``masc-cache info`` reports their
sizes and ``masc-cache clean`` removes them (cli/cache_cmd.py). Bundles, scores, maps and
``--cache-dir`` stores go where their options say, never here.
"""

from __future__ import annotations

import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from ..errors import MascEngineError

#: Environment variable naming the cache root itself (takes precedence over XDG_CACHE_HOME).
ENV_VAR = "MASC_ENGINE_CACHE"

#: Subfolder of the root holding the random-weight checkpoints (export/checkpoint.py).
CHECKPOINTS = "random-models"
#: Subfolder of the root holding the TensorRT timing caches (engine/backends/tensorrt.py).
TENSORRT = "tensorrt"
#: Subfolder of the root holding what makes a cold process start faster, with the same results:
#: OpenVINO's compiled models per bundle (``openvino/<bundle fingerprint>``, engine/backends/
#: openvino.py) and the stat records of graph files already hashed (``verified/``,
#: engine/verified_files.py).
RUNTIME = "runtime"
#: Every subfolder masc-engine writes under the root, in the order ``masc-cache info`` lists them.
SUBFOLDERS = (CHECKPOINTS, TENSORRT, RUNTIME)


class CacheRootError(MascEngineError):
    """The cache root cannot be cleaned safely: it is a symbolic link, ``/`` or the home folder
    itself, not a folder, or it holds something masc-engine never writes there (so it is not
    masc-engine's cache); or it cannot be read. The message is one line naming the root."""


def cache_root() -> Path:
    """The cache root: where masc-engine keeps what it writes outside the user's explicit paths.

    The rule, first match wins:

    1. ``$MASC_ENGINE_CACHE`` when set and not empty (``~`` expanded), used as is;
    2. ``$XDG_CACHE_HOME/masc-engine`` when ``XDG_CACHE_HOME`` is set to an absolute path (the XDG
       Base Directory rule: an empty or relative value is ignored);
    3. ``~/.cache/masc-engine``.

    Nothing is created or read: the folder may not exist yet.

    Returns:
        The root's path (absolute unless ``MASC_ENGINE_CACHE`` is relative).
    """
    return cache_root_and_rule()[0]


def cache_root_and_rule() -> tuple[Path, str]:
    """:func:`cache_root` and the rule that chose it (``"MASC_ENGINE_CACHE"``, ``"XDG_CACHE_HOME"``
    or ``"default"``), for ``masc-cache info``."""
    own = os.environ.get(ENV_VAR, "")
    if own:
        return Path(own).expanduser(), ENV_VAR
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "masc-engine", "XDG_CACHE_HOME"
    return Path.home() / ".cache" / "masc-engine", "default"


def tree_bytes(path: Path) -> int:
    """Apparent size of a folder: the sum of ``st_size`` over the regular files under ``path``.

    Symbolic links are neither followed nor counted (a link inside the root that points elsewhere
    adds nothing); a path that is itself a link, or absent, is 0 bytes; a regular file is its size.

    Raises:
        OSError: a folder under ``path`` cannot be listed.
    """
    st = os.lstat(path) if os.path.lexists(path) else None
    if st is None or stat.S_ISLNK(st.st_mode):
        return 0
    if not stat.S_ISDIR(st.st_mode):
        return st.st_size if stat.S_ISREG(st.st_mode) else 0

    def fail(e: OSError) -> NoReturn:
        raise e

    total = 0
    for top, _dirs, files in os.walk(path, followlinks=False, onerror=fail):
        for name in files:
            st = os.lstat(os.path.join(top, name))
            total += st.st_size if stat.S_ISREG(st.st_mode) else 0
    return total


def check_cleanable(root: Path) -> Path:
    """The root's absolute path, if masc-engine may remove things inside it.

    Refused: a root that is a symbolic link, that resolves to ``/`` or to the home folder itself,
    that exists but is not a folder, or that holds any entry other than :data:`SUBFOLDERS` (a
    folder with other content is not masc-engine's cache: ``MASC_ENGINE_CACHE`` may point at the
    wrong place). An absent root is allowed (there is nothing to remove).

    Raises:
        CacheRootError: one of the refusals above, or the root cannot be listed.
    """
    root = Path(os.path.abspath(root))
    if root.is_symlink():
        raise CacheRootError(
            f"cache root {root} is a symbolic link: refusing to clean through it (point {ENV_VAR} at the real folder)"
        )
    real = root.resolve()
    if real == Path(real.anchor) or real == Path.home().resolve():
        raise CacheRootError(
            f"cache root {root} is {'/' if real == Path(real.anchor) else 'the home folder'} "
            f"itself: refusing to clean it (set {ENV_VAR} to a folder of its own)"
        )
    if not root.exists():
        return root
    if not root.is_dir():
        raise CacheRootError(f"cache root {root} is not a folder: refusing to clean it")
    try:
        foreign = sorted(e for e in os.listdir(root) if e not in SUBFOLDERS)
    except OSError as e:
        raise CacheRootError(f"cache root {root} cannot be listed: {e.strerror or e}") from None
    if foreign:
        raise CacheRootError(
            f"cache root {root} holds {', '.join(repr(e) for e in foreign[:3])}"
            f"{' and more' if len(foreign) > 3 else ''}, which masc-engine never writes there: "
            f"not a masc-engine cache, refusing to clean it (expected only {', '.join(SUBFOLDERS)})"
        )
    return root


@dataclass(frozen=True)
class Removal:
    """One subfolder of the root removed (or, in a dry run, that would be): its path and bytes."""

    path: Path
    bytes: int


def remove_subfolder(root: Path, name: str, dry_run: bool = False) -> Removal | None:
    """Remove ``root/name`` (one of :data:`SUBFOLDERS`) without following any symbolic link.

    ``root`` must have passed :func:`check_cleanable`. A subfolder that is a symbolic link is
    unlinked (its target is left alone); links inside it are removed as links
    (``shutil.rmtree`` never follows them).

    Args:
        root: the checked cache root.
        name: the subfolder, one of :data:`SUBFOLDERS`.
        dry_run: report what would be removed, remove nothing.

    Returns:
        What was removed (bytes as :func:`tree_bytes` counts them), or None when it was absent.

    Raises:
        CacheRootError: ``name`` is not a known subfolder, or removing failed (permissions).
    """
    if name not in SUBFOLDERS:
        raise CacheRootError(f"{name!r} is not a subfolder of the cache root (known: {', '.join(SUBFOLDERS)})")
    path = root / name
    if not os.path.lexists(path):
        return None
    try:
        size = tree_bytes(path)
        if not dry_run:
            if path.is_symlink() or not path.is_dir():
                path.unlink()
            else:
                shutil.rmtree(path)
    except OSError as e:
        raise CacheRootError(f"could not remove {path}: {e.strerror or e}") from None
    return Removal(path, size)


def human_bytes(n: int) -> str:
    """``n`` bytes in binary units with one decimal (``"3.4 GiB"``); under 1 KiB in bytes (``"512 B"``)."""
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        # Compare the value as printed: 1048575 B is 1023.999 KiB, which prints as "1024.0 KiB".
        if round(value, 1) < 1024 or unit == "TiB":
            break
    return f"{value:.1f} {unit}"
