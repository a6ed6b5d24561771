#!/usr/bin/env python3
"""Write the option tables of docs/commands.md from the click commands themselves.

``--help`` and the reference come from one source: each command's block in docs/commands.md
(between ``<!-- BEGIN generated: NAME -->`` and ``<!-- END generated: NAME -->``) is rendered from
its click definition (usage line, arguments, options: names, value, default, help). The text
around the blocks is written by hand. The commands are the ``[project.scripts]`` of
pyproject.toml; a click group (masc-eval) gets one block per subcommand.

    python scripts/gen_cli_docs.py           # rewrite docs/commands.md's blocks
    python scripts/gen_cli_docs.py --check   # exit 1 if a block is stale or missing (tests/test_readme.py)

Run from a checkout with masc-engine importable (``. .venv/bin/activate`` or
``PYTHONPATH=src``); it needs click and the runtime's imports only (no torch).
"""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "commands.md"
BEGIN = "<!-- BEGIN generated: {name} (scripts/gen_cli_docs.py; edit the click command, then rerun it) -->"
END = "<!-- END generated: {name} -->"
_BLOCK = re.compile(
    r"<!-- BEGIN generated: (?P<name>[\w -]+?) \(.*?-->\n(?P<body>.*?)<!-- END generated: (?P=name) -->", re.S
)


def scripts(pyproject: Path = ROOT / "pyproject.toml") -> dict[str, str]:
    """``{command: "module:attr"}`` from pyproject.toml's ``[project.scripts]``, in file order."""
    out, inside = {}, False
    for line in pyproject.read_text(encoding="utf-8").splitlines():
        s = line.strip()
        if s.startswith("["):
            inside = s == "[project.scripts]"
        elif inside and "=" in s and not s.startswith("#"):
            name, target = (x.strip().strip('"') for x in s.split("=", 1))
            out[name] = target
    return out


def load(target: str):
    """The click object behind an entry point (``"masc_engine.cli.run_cmd:main"``)."""
    module, attr = target.split(":")
    return getattr(importlib.import_module(module), attr)


def commands() -> dict[str, tuple]:
    """``{"masc-run": (click.Command, ["masc-run"]), "masc-eval auc": (..., ["masc-eval", "auc"]), ...}``."""
    import click

    out = {}
    for name, target in scripts().items():
        cmd = load(target)
        if isinstance(cmd, click.Group):
            for sub in cmd.list_commands(click.Context(cmd, info_name=name)):
                out[f"{name} {sub}"] = (cmd.get_command(click.Context(cmd, info_name=name), sub), [name, sub])
        else:
            out[name] = (cmd, [name])
    return out


def _number(x) -> str:
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e15:
        x = int(x)
    return str(x)


def value_kind(param) -> str:
    """What a parameter takes, in words: ``folder``, ``file``, ``integer 1-1024``, ``regex, spacy, none``."""
    import click

    t = param.type
    if getattr(param, "is_flag", False) and not getattr(param, "secondary_opts", None):
        return "flag"
    if getattr(param, "secondary_opts", None):
        return "on/off"
    if isinstance(t, click.Choice):
        return ", ".join(f"`{c}`" for c in t.choices)
    if isinstance(t, click.Path):
        return "folder" if not t.file_okay else "file" if not t.dir_okay else "path"
    if isinstance(t, (click.IntRange, click.FloatRange)):
        kind = "integer" if isinstance(t, click.IntRange) else "number"
        lo, hi = t.min, t.max
        if lo is not None and hi is not None:
            return f"{kind} {_number(lo)}-{_number(hi)}"
        return f"{kind} >= {_number(lo)}" if lo is not None else f"{kind} <= {_number(hi)}"
    return {"integer": "integer", "float": "number", "boolean": "on/off"}.get(t.name, "text")


def default_text(param, ctx) -> str:
    """The default as a user types it; ``required``; or empty (none, or the flag off)."""
    if param.required:
        return "required"
    if getattr(param, "is_flag", False) and not getattr(param, "secondary_opts", None):
        return ""
    d = param.get_default(ctx, call=False)
    if d is None or d == () or callable(d) or type(d).__name__ == "Sentinel":
        return ""
    if isinstance(d, bool):
        return (param.opts if d else param.secondary_opts)[0]
    return f"`{_number(d)}`"


def _cell(text: str) -> str:
    return " ".join((text or "").split()).replace("|", "\\|")


def render_block(name: str, cmd, path: list[str]) -> str:
    """One command's generated Markdown: its usage line and a table of arguments and options."""
    import click

    ctx = click.Context(cmd, info_name=" ".join(path), **cmd.context_settings)
    usage = " ".join([" ".join(path), *cmd.collect_usage_pieces(ctx)])
    rows = ["| option | value | default | what |", "| --- | --- | --- | --- |"]
    for p in cmd.get_params(ctx):
        if isinstance(p, click.Argument):
            names = f"`{p.human_readable_name}`"
            what = "argument (see the command's description)"
        else:
            if p.name == "help" or p.name.startswith("_click"):  # -h/--help: every command has it
                continue
            names = ", ".join(f"`{o}`" for o in [*p.opts, *p.secondary_opts])
            what = p.help or ""
        rows.append(f"| {names} | {_cell(value_kind(p))} | {default_text(p, ctx)} | {_cell(what)} |")
    return "\n".join([f"```\n{usage}\n```", "", *rows, ""])


def render(text: str) -> str:
    """``text`` (docs/commands.md) with every generated block rewritten from the commands.

    Raises:
        ValueError: a command has no block in ``text``, or a block names no command.
    """
    cmds = commands()
    seen = set()

    def fill(m: re.Match) -> str:
        name = m["name"]
        if name not in cmds:
            raise ValueError(f"{DOC.name}: generated block {name!r} names no command (known: {', '.join(cmds)})")
        seen.add(name)
        return f"{BEGIN.format(name=name)}\n{render_block(name, *cmds[name])}{END.format(name=name)}"

    out = _BLOCK.sub(fill, text)
    missing = [c for c in cmds if c not in seen]
    if missing:
        raise ValueError(
            f"{DOC.name}: no generated block for {', '.join(missing)}; add "
            + " ".join(f"'{BEGIN.format(name=c)}' '{END.format(name=c)}'" for c in missing)
        )
    return out


def main(argv: list[str]) -> int:
    check = "--check" in argv
    text = DOC.read_text(encoding="utf-8")
    try:
        new = render(text)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if new == text:
        print(f"{DOC.relative_to(ROOT)}: up to date")
        return 0
    if check:
        print(
            f"{DOC.relative_to(ROOT)} is stale: its option tables differ from the click commands; "
            "run: python scripts/gen_cli_docs.py",
            file=sys.stderr,
        )
        return 1
    DOC.write_text(new, encoding="utf-8")
    print(f"{DOC.relative_to(ROOT)}: rewritten")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "src"))
    sys.exit(main(sys.argv[1:]))
