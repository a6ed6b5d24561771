"""One output per ``--save-maps`` folder: maps are named by row (``0000001_cp.png``), so two
outputs sharing a folder would overwrite each other's maps, and the first output's ``cp_map`` /
``pf_map`` cells would show the second one's pairs. The folder records its output in a marker
file, :data:`MARKER` (``{"output": "<resolved output path>"}``), written when a run starts; a run
for another output is refused before anything is scored, unless ``--overwrite``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..results import SettingsChangedError
from ..tables import open_fresh

#: The marker file in a ``--save-maps`` folder naming the output whose maps it holds.
MARKER = ".masc-run-maps.json"


def maps_owner(folder: Path) -> str | None:
    """The resolved output path the maps in ``folder`` belong to, ``None`` where no marker is
    there; a marker that cannot be read names an unknown owner (``"an unreadable marker"``)."""
    path = folder / MARKER
    if not path.exists() and not path.is_symlink():
        return None
    try:
        owner = json.loads(path.read_text(encoding="utf-8")).get("output")
    except (OSError, ValueError, AttributeError, RecursionError):
        owner = None
    return owner if isinstance(owner, str) and owner else "an unreadable marker"


def check_maps_owner(folder: Path, out: Path, overwrite: bool) -> None:
    """Refuse a ``--save-maps`` folder that holds another output's maps (its :data:`MARKER`),
    unless ``overwrite``.

    Raises:
        SettingsChangedError: one line naming the folder, its output and the ways out.
    """
    owner = maps_owner(folder)
    if owner is None or overwrite or owner == os.path.realpath(out):
        return
    raise SettingsChangedError(
        f"--save-maps {folder} holds the maps of {owner} ({folder / MARKER}), which this run "
        f"for {out} would overwrite: nothing was scored; choose another --save-maps folder, or "
        "--overwrite replaces those maps"
    )


def claim_maps(folder: Path, out: Path) -> None:
    """Record ``out`` as the output of the maps in ``folder`` (:data:`MARKER`, written to a fresh
    temporary file and renamed into place; the folder is created).

    Raises:
        OSError: the folder or the marker cannot be written.
    """
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / MARKER
    if maps_owner(folder) == os.path.realpath(out):
        return
    tmp = path.with_name(f"{MARKER}.{os.getpid()}.partial")
    try:
        with open_fresh(tmp) as f:
            f.write(json.dumps({"output": os.path.realpath(out)}) + "\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
