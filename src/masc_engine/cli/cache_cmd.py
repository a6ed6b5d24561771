"""masc-cache: the size of masc-engine's cache root, and its cleaning.

The root is :func:`masc_engine.engine.cache_root.cache_root` (``$MASC_ENGINE_CACHE``, else
``$XDG_CACHE_HOME/masc-engine``, else ``~/.cache/masc-engine``): the random-weight checkpoints
(``random-models/``) and the TensorRT timing caches (``tensorrt/``). ``masc-cache info`` writes
nothing; ``masc-cache clean`` removes only the named subfolders of the root, never follows a
symbolic link, and refuses (one line, exit status 1) a root that is a link, ``/``, the home
folder itself or a folder holding anything else (the rules of
:func:`~masc_engine.engine.cache_root.check_cleanable`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from .logs import PrintableGroup, echo

from ..engine.cache_root import (
    CHECKPOINTS,
    SUBFOLDERS,
    TENSORRT,
    RUNTIME,
    CacheRootError,
    cache_root_and_rule,
    check_cleanable,
    human_bytes,
    remove_subfolder,
    tree_bytes,
)

#: What each subfolder holds, for ``masc-cache info``.
DESCRIPTIONS = {
    CHECKPOINTS: "random-weight checkpoints (masc-export --model random:<preset>)",
    TENSORRT: "TensorRT timing caches (masc-export --backend tensorrt)",
    RUNTIME: "OpenVINO compiled models, hashed-graph records (a cold run's start-up)",
}


def _size_line(label: str, n: int, note: str = "") -> str:
    return f"{label + ':':<15}{human_bytes(n):>10}  ({n:,} bytes){'  ' + note if note else ''}"


@click.group(cls=PrintableGroup, context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Show or clean what masc-engine keeps in its cache root: $MASC_ENGINE_CACHE, else
    $XDG_CACHE_HOME/masc-engine, else ~/.cache/masc-engine."""


@main.command()
def info() -> None:
    """Print the cache root, each subfolder's size and the total, one line each (writes nothing)."""
    root, rule = cache_root_and_rule()
    root = Path(os.path.abspath(root))
    exists = root.is_dir() and not root.is_symlink()
    state = (
        ""
        if exists
        else (
            "  (a symbolic link: not followed)"
            if root.is_symlink()
            else "  (not a folder)"
            if os.path.lexists(root)
            else "  (not created yet)"
        )
    )
    echo(f"cache root: {root}  (from {rule}){state}")
    total = 0
    for name in SUBFOLDERS:
        path = root / name
        link = exists and path.is_symlink()
        try:
            n = tree_bytes(path) if exists else 0
        except OSError as e:
            raise click.ClickException(f"cannot read {path}: {e.strerror or e}") from None
        total += n
        echo(_size_line(name, n, "a symbolic link, not followed" if link else DESCRIPTIONS[name]))
    echo(_size_line("total", total))
    if exists:
        try:
            other = sorted(set(os.listdir(root)) - set(SUBFOLDERS))
        except OSError as e:
            raise click.ClickException(f"cannot list {root}: {e.strerror or e}") from None
        if other:
            echo(f"not masc-engine's (not sized; masc-cache clean refuses this root): {', '.join(other)}")


@main.command()
@click.option("--checkpoints", is_flag=True, help=f"Remove {CHECKPOINTS}/: the random-weight checkpoints.")
@click.option("--tensorrt", is_flag=True, help=f"Remove {TENSORRT}/: the TensorRT timing caches.")
@click.option("--all", "all_", is_flag=True, help="Remove every subfolder masc-engine writes in the root.")
@click.option("--dry-run", is_flag=True, help="Print what would be removed and its size; remove nothing.")
def clean(checkpoints: bool, tensorrt: bool, all_: bool, dry_run: bool) -> None:
    """Remove subfolders of the cache root, printing each with the bytes freed. Refuses a root that
    is a symbolic link, / or the home folder itself, or that holds anything masc-engine does not
    write there; symbolic links inside the root are removed as links, never followed."""
    names = SUBFOLDERS if all_ else tuple(n for n, on in ((CHECKPOINTS, checkpoints), (TENSORRT, tensorrt)) if on)
    if not names:
        raise click.UsageError("name what to remove: --checkpoints, --tensorrt or --all")
    try:
        root = check_cleanable(cache_root_and_rule()[0])
        removed = [r for r in (remove_subfolder(root, n, dry_run) for n in names) if r is not None]
    except CacheRootError as e:
        raise click.ClickException(str(e)) from None
    verb = "would remove" if dry_run else "removed"
    for r in removed:
        echo(f"{verb} {r.path}  {human_bytes(r.bytes)} ({r.bytes:,} bytes)")
    freed = sum(r.bytes for r in removed)
    if not removed:
        echo(f"nothing to remove in {root} ({', '.join(n + '/' for n in names)} absent)")
    echo(f"{'would free' if dry_run else 'freed'} {human_bytes(freed)} ({freed:,} bytes)")


if __name__ == "__main__":
    sys.exit(main())
