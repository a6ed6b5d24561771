"""The front page and the reference against the code (no network, no bundle, a second or two).

- docs/commands.md's option tables are what scripts/gen_cli_docs.py renders from the click
  commands (a stale page fails with the command that refreshes it);
- every command line in the README's and docs/commands.md's code blocks and inline code, and
  every option their prose and option tables name, exists in that command's click definition,
  with a value among its choices where it has choices;
- every docs page is linked from the README or docs/index.md, every relative link resolves (file
  and heading anchor), and the README stays a front page (at most 200 lines).
"""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path

import click
import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
README = REPO / "README.md"
COMMANDS_MD = DOCS / "commands.md"
#: Names that look like commands but are packages: the project itself and its oracle.
NOT_COMMANDS = {"masc-engine", "masc-metric"}


def _gen():
    spec = importlib.util.spec_from_file_location("gen_cli_docs", REPO / "scripts" / "gen_cli_docs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def commands() -> dict:
    """``{"masc-run": click.Command, "masc-eval": click.Group, ...}`` from pyproject's scripts."""
    gen = _gen()
    return {name: gen.load(target) for name, target in gen.scripts().items()}


def test_commands_page_is_generated_from_the_commands():
    text = COMMANDS_MD.read_text(encoding="utf-8")
    assert _gen().render(text) == text, (
        "docs/commands.md's option tables differ from the click commands: "
        "run  python scripts/gen_cli_docs.py  and commit the result"
    )


# ------------------------------------------------------------------------------ parsing Markdown


def _code_blocks(text: str) -> list[str]:
    return re.findall(r"^```[a-z]*\n(.*?)^```", text, re.S | re.M)


def _prose(text: str) -> str:
    return re.sub(r"^```[a-z]*\n.*?^```", "", text, flags=re.S | re.M)


def _sections(text: str) -> list[tuple[str, str]]:
    """``(heading, body)`` per section of the prose (code blocks removed); a ``###`` section
    belongs to its ``##`` section's command (its heading is prefixed with the parent's)."""
    parts = re.split(r"^(#{1,3} .*)$", _prose(text), flags=re.M)
    out, parent = [("", parts[0])], ""
    for i in range(1, len(parts), 2):
        level, heading = len(parts[i]) - len(parts[i].lstrip("#")), parts[i].lstrip("#").strip()
        if level <= 2:
            parent = heading
        elif not heading.startswith(("masc-", "`masc-")):
            heading = f"{parent} / {heading}"
        out.append((heading, parts[i + 1]))
    return out


def _command_lines(block: str) -> list[list[str]]:
    """Token lists of the shell commands in a code block that start with a masc command."""
    out = []
    for line in block.replace("\\\n", " ").splitlines():
        try:
            tokens = shlex.split(line, comments=True)
        except ValueError:
            continue  # a Python line, not shell
        cmd: list[str] = []
        for t in [*tokens, ";"]:
            if t in (";", "&&", "||", "|", "&"):
                if cmd and cmd[0].startswith("masc-"):
                    out.append(cmd)
                cmd = []
            else:
                cmd.append(t.rstrip("&") if t.endswith("&") and len(t) > 1 else t)
    return out


def _options(cmd: click.Command) -> dict[str, click.Parameter]:
    ctx = click.Context(cmd, **cmd.context_settings)
    out = {}
    for p in cmd.get_params(ctx):
        for name in [*getattr(p, "opts", []), *getattr(p, "secondary_opts", [])]:
            if name.startswith("-"):
                out[name] = p
    return out


def _resolve(commands: dict, tokens: list[str]) -> tuple[str, click.Command, list[str]]:
    """The command a token list runs (a group's subcommand included) and its remaining arguments."""
    name = tokens[0]
    assert name in commands or name in NOT_COMMANDS, f"{name!r} is not a command (known: {', '.join(commands)})"
    cmd, args = commands.get(name), tokens[1:]
    if isinstance(cmd, click.Group):
        if args and args[0] in cmd.commands:
            name, cmd, args = f"{name} {args[0]}", cmd.commands[args[0]], args[1:]
        elif args and not args[0].startswith("-"):
            name, cmd = f"{name} agreement", cmd.commands["agreement"]  # masc-eval SCORES ... is agreement
    return name, cmd, args


def _check_args(where: str, name: str, cmd: click.Command, args: list[str]) -> None:
    opts = _options(cmd)
    i = 0
    while i < len(args):
        a = args[i]
        i += 1
        if not a.startswith("-") or a == "-":
            continue
        key, _, inline = a.partition("=")
        assert key in opts, f"{where}: {name} has no option {key} (in {' '.join([name, *args])!r})"
        p = opts[key]
        if getattr(p, "is_flag", False) or p.count:
            continue
        value = inline if inline else (args[i] if i < len(args) else None)
        i += 0 if inline else 1
        if isinstance(p.type, click.Choice) and value is not None and not re.search(r"[|A-Z<]", value):
            assert value in p.type.choices, f"{where}: {name} {key} {value!r} is not one of {p.type.choices}"


def _spans(text: str) -> list[str]:
    return re.findall(r"(?<!`)`([^`\n]+)`(?!`)", text)


def _check_page(path: Path, commands: dict) -> int:
    text = path.read_text(encoding="utf-8")
    where = path.relative_to(REPO).as_posix() if path.is_relative_to(REPO) else path.name
    checked = 0
    for block in _code_blocks(text):
        for tokens in _command_lines(block):
            _check_args(where, *_resolve(commands, tokens))
            checked += 1
    every = {
        o: c
        for c in commands.values()
        for sub in ([*c.commands.values()] if isinstance(c, click.Group) else [c])
        for o in _options(sub)
    }
    for heading, body in _sections(text):
        words = re.findall(r"[\w-]+", heading)
        section_cmd = _resolve(commands, words[:2]) if words and words[0] in commands else None
        for span in _spans(body):
            words = span.split()
            if words and re.fullmatch(r"masc-[a-z]+", words[0]) and words[0] not in NOT_COMMANDS:
                try:
                    tokens = shlex.split(span)
                except ValueError:
                    tokens = words
                _check_args(where, *_resolve(commands, tokens))
                checked += 1
            for opt in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", span if span.startswith("--") else ""):
                if section_cmd:
                    assert opt in _options(section_cmd[1]), (
                        f"{where}, section {heading!r}: {section_cmd[0]} has no {opt}"
                    )
                else:
                    assert opt in every, f"{where}, section {heading!r}: no command has {opt}"
                checked += 1
        for row in re.findall(r"^\| *(`--[^|]*)\|", body, re.M):
            for opt in re.findall(r"`(--?[a-z][a-z0-9-]*)", row):
                if section_cmd:
                    assert opt in _options(section_cmd[1]), (
                        f"{where}, table under {heading!r}: {section_cmd[0]} has no {opt}"
                    )
                else:
                    assert opt in every, f"{where}, table under {heading!r}: no command has {opt}"
                checked += 1
    for name in set(re.findall(r"(?<![\w/.-])(masc-[a-z]+)\b", _prose(text))):
        assert name in commands or name in NOT_COMMANDS, f"{where}: {name} is not a command"
    return checked


@pytest.mark.parametrize("page", [README, COMMANDS_MD], ids=lambda p: p.name)
def test_commands_and_options_named_exist(page, commands):
    assert _check_page(page, commands) >= 10


def test_the_check_catches_a_wrong_option_and_a_wrong_choice(commands, tmp_path):
    """The check above fails on the mistakes it is for (a renamed option, a value not offered)."""
    for wrong in (
        "```bash\nmasc-run p.csv --bundle b --no-such-flag\n```\n",
        "```bash\nmasc-run p.csv --bundle b --stripper nltk\n```\n",
        "```bash\nmasc-rnu p.csv\n```\n",
        "## masc-report\n\nUse `--no-progress` here.\n",
        "## masc-run\n\n### Resume\n\nUse `--gallery` here.\n",
    ):
        page = tmp_path / "page.md"
        page.write_text(wrong, encoding="utf-8")
        with pytest.raises(AssertionError):
            _check_page(page, commands)


# ------------------------------------------------------------------------------------- the pages


def test_readme_is_a_front_page():
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n <= 200, f"README.md has {n} lines: move reference text to a docs/ page and link it"


def _links(path: Path) -> list[str]:
    return re.findall(r"\]\(([^)\s]+)\)", _prose(path.read_text(encoding="utf-8")))


def test_every_docs_page_is_linked_from_the_readme_or_the_index():
    linked = {(README.parent / u.split("#")[0]).resolve() for u in _links(README)}
    linked |= {(DOCS / u.split("#")[0]).resolve() for u in _links(DOCS / "index.md")}
    assert (DOCS / "index.md").resolve() in linked
    missing = [p.name for p in sorted(DOCS.glob("*.md")) if p.name != "index.md" and p.resolve() not in linked]
    assert not missing, f"docs pages linked neither from README.md nor from docs/index.md: {missing}"


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation other than '-' and '_' dropped, spaces as '-'."""
    out = set()
    for h in re.findall(r"^#{1,6} (.*)$", _prose(path.read_text(encoding="utf-8")), re.M):
        out.add(re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-"))
    return out


def test_relative_links_resolve():
    bad = []
    for page in [README, *sorted(DOCS.glob("*.md"))]:
        for url in _links(page):
            if re.match(r"[a-z]+:", url):
                continue
            file, _, anchor = url.partition("#")
            target = (page.parent / file).resolve() if file else page
            if not target.exists():
                bad.append(f"{page.name}: {url} (no such file)")
            elif anchor and target.suffix == ".md" and anchor not in _anchors(target):
                bad.append(f"{page.name}: {url} (no such heading)")
    assert not bad, bad
