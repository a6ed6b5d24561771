"""Every command block of the README and docs/ runs as pasted, in a folder laid out as a checkout.

Inventory (fast): each fenced block of README.md and docs/*.md that holds commands (``bash``,
``sh`` or ``python``, or an unlabelled block whose first line starts with a command) is either
run here (``RUN``, in that order), run by another test (``ELSEWHERE``) or not run, with the
reason (``NOT_RUN``: real weights from the Hub, a GPU, a cluster, package installs). A new or
changed block that is in none of them fails, naming the page and its first line; so does an
entry that names no block.

Run (slow): the ``RUN`` blocks run one after another in one folder holding what a clone holds
for them (``scripts/``, ``pyproject.toml``, ``constraints/``, ``examples/``) and a ``.venv``
whose packages are this test environment's, recorded as set up (the state the demo leaves; its
setup stage then reports "up to date", offline). Shell blocks run under ``bash -e -o pipefail``
(a failing line fails the block), Python blocks with this interpreter; each must exit 0 without
a traceback and print what its page promises (``PROMISES``). The edits a test needs, and only
these: ``pip install`` lines are dropped (the environment has every extra); a ``masc-export``
line whose model and options another fixture of this test run already exported
(``ALREADY_EXPORTED``: the command-line export of random:tiny-naflex, the segmenter, the
embedder presets) links that bundle at its ``--out`` instead of exporting it again.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
#: The first word of a command line in an unlabelled block (an unlabelled block of anything else
#: is output shown on the page: a log, an error message; so is a usage line, with ``[OPTIONS]``).
COMMAND_WORDS = re.compile(r"^(masc-[a-z]+|python3?|pip|bash|curl|ray|\.)(\s|$)")

#: Run here, in this order: (page, the block's first line). The order is a reader's: the README
#: from its demo on, then the pages that build on what it made.
RUN = [
    ("README.md", "bash scripts/demo.sh"),
    ("README.md", ". .venv/bin/activate"),
    ("README.md", "masc-export --model random:tiny-naflex --out bundles/tiny-fp32"),
    (
        "README.md",
        "masc-run examples/dreambooth/pairs.csv --bundle bundles/tiny-naflex --out out/scores.csv --save-maps out/maps",
    ),
    (
        "README.md",
        "masc-report out/scores.csv --within-column same_subject --out out/report.html --image-root examples/dreambooth",
    ),
    (
        "README.md",
        "masc-rank --oracle --gallery examples/dreambooth/gallery.csv --bundle bundles/tiny-naflex --out out/rank.csv",
    ),
    ("README.md", "masc-eval auc out/scores.csv --within-column same_subject"),
    ("README.md", "import numpy as np"),
    (
        "docs/evaluation.md",
        "masc-run examples/dreambooth/pairs.csv --bundle bundles/tiny-naflex --out out/scores.csv --save-maps out/maps",
    ),
    (
        "docs/evaluation.md",
        "masc-eval agreement out/scores.csv --ratings examples/dreambooth/ratings_illustrative.csv \\",
    ),
    (
        "docs/evaluation.md",
        "masc-eval agreement out/scores.csv --ratings examples/dreambooth/ratings_illustrative.csv \\#2",
    ),
    ("docs/evaluation.md", "masc-eval auc out/scores.csv --within-column same_subject"),
    ("docs/evaluation.md", "masc-eval auc out/scores.csv --within-column same_subject --metrics all --format md"),
    ("docs/evaluation.md", "masc-eval table examples/dreambooth/scores_illustrative.csv --average-references"),
    (
        "docs/evaluation.md",
        "masc-eval compare examples/dreambooth/scores_illustrative.csv --a method_a --b method_b --average-references",
    ),
    (
        "docs/evaluation.md",
        "masc-report out/scores.csv --within-column same_subject --out out/report.html --image-root examples/dreambooth",
    ),
    (
        "docs/evaluation.md",
        "masc-rank --oracle --gallery examples/dreambooth/gallery.csv --bundle bundles/tiny-naflex --out out/rank.csv",
    ),
    ("docs/evaluation.md", "from masc_engine.jobs import evaluation as ev"),
    ("docs/evaluation.md", "import csv"),
    ("docs/python-api.md", "import numpy as np"),
    ("docs/metrics.md", "masc-export --model random:clip-tiny --out bundles/clip-tiny"),
    ("docs/python-api.md", "from masc_engine.jobs.pairs import PairsJob, RunOptions, RunSettings, run_pairs"),
    ("docs/segmenter.md", "masc-export --model random:clipseg-tiny --out bundles/clipseg-tiny"),
    ("docs/segmenter.md", "import numpy as np"),
    ("docs/segmenter.md", "import hashlib"),
    ("docs/cpu_precision.md", 'pip install -e ".[openvino]"        # in the demo\'s .venv'),
]

#: Run by another test, as pasted there.
ELSEWHERE = {
    ("README.md", 'pip install -e ".[serve]"'): "tests/test_readme_serve_block.py",
    (
        "docs/service.md",
        'pip install -e ".[serve]"                                   # fastapi, uvicorn, python-multipart, prometheus-client',
    ): "tests/test_readme_serve_block.py",
    ("docs/service.md", "import base64, json, urllib.request"): "tests/test_readme_serve_block.py",
    (
        "docs/architecture.md",
        "# src/masc_engine/runtime/pair_metrics/cp_mean.py",
    ): "tests/test_pair_metrics.py (a module's source, imported as a plug-in)",
    ("README.md", "bash scripts/test.sh"): ".ci/run (the test command itself)",
}

#: Not run by any test, and why.
NOT_RUN = {
    (
        "docs/commands.md",
        "ray start --head                        # head node",
    ): "a Ray cluster across machines (tests/test_ray.py runs the executor on a local cluster)",
    (
        "docs/gpu.md",
        'pip install "onnxruntime-gpu[cuda,cudnn]==1.31.1" "cupy-cuda13x[ctk]==14.2.0" numpy "pillow>=10" \\',
    ): "installs the GPU packages from the index (no GPU here)",
    (
        "docs/install.md",
        "python3 -m venv .venv && . .venv/bin/activate",
    ): "installs packages from the index (scripts/setup_env.sh, which .ci/run runs, installs the same extras)",
    (
        "docs/install.md",
        'pip install "onnxruntime-gpu[cuda,cudnn]==1.31.1" "cupy-cuda13x[ctk]==14.2.0" numpy "pillow>=10" "tokenizers>=0.20" \\',
    ): "installs the GPU packages from the index (no GPU here)",
    (
        "docs/metrics.md",
        "masc-export --model clip-vit-b32 --out bundles/clip-b32       # real weights (the Hub, or a local folder)",
    ): "real weights from the Hub",
    (
        "docs/segmenter.md",
        "masc-export --model CIDAS/clipseg-rd64-refined --out bundles/clipseg",
    ): "real weights from the Hub",
    (
        "docs/segmenter.md",
        "masc-export --model CIDAS/clipseg-rd64-refined --out bundles/clipseg              # the checkpoint (short name: clipseg)",
    ): "real weights from the Hub and a local folder",
    (
        "docs/segmenter.md",
        "python bench/segmenter.py --out /tmp/segmenter_rd64.json     # random:clipseg-rd64 + base-naflex/256; the committed run: --out bench/results/segmenter_rd64.json",
    ): "a bench at the real shapes (minutes; tests/test_bench_scripts.py runs the benches on tiny shapes)",
    (
        "docs/service.md",
        "from ray import serve",
    ): "a Ray Serve deployment of a so400m bundle (tests/test_serve.py tests create_app)",
}

#: ``masc-export`` lines whose bundle another fixture of this run exports with the same model and
#: options: the fixture's name (tests/conftest.py), or ``embedder_bundles[<preset>]``.
ALREADY_EXPORTED = {
    ("random:tiny-naflex",): "naflex_bundle",
    ("random:clip-tiny",): "embedder_bundles[clip-tiny]",
    ("random:dino-tiny-s16",): "embedder_bundles[dino-tiny-s16]",
    ("random:clipseg-tiny",): "seg_bundle",
}

#: What a block's page promises it prints: regular expressions, each searched in its stdout and
#: stderr (one after the other: each stream keeps its own order).
PROMISES = {
    ("README.md", "bash scripts/demo.sh"): (
        r"^\[1/3\] environment: .*\n.*\n\[3/3\] scoring",
        r"^rows: 20  ok: 20  not ok: 0",
    ),
    ("README.md", "import numpy as np"): r"^-?\d\.\d+ -?\d\.\d+$",
    ("README.md", "masc-eval auc out/scores.csv --within-column same_subject"): r"^pooled\s.*\d\.\d",
    ("docs/python-api.md", "import numpy as np"): r"MaSCResult",
    ("docs/segmenter.md", "import numpy as np"): r"segmenter",
    ("docs/cpu_precision.md", 'pip install -e ".[openvino]"        # in the demo\'s .venv'): r"bf16-cpu",
}


#: Blocks a machine may refuse, with the refusal their page documents: (what the block needs,
#: what the refusal says where it is missing).
REFUSED_HERE = {
    ("docs/cpu_precision.md", 'pip install -e ".[openvino]"        # in the demo\'s .venv'): (
        "native bf16",
        r"native bf16",
    ),
}


def _can_run(need: str) -> bool:
    """Whether this machine has what a block in ``REFUSED_HERE`` needs."""
    assert need == "native bf16", need
    try:
        from masc_engine.engine.backends.openvino import cpu_supports_bf16
    except ImportError:  # without the openvino extra the block names it instead
        return False
    return cpu_supports_bf16()


def _fenced(text: str) -> list[tuple[str, str]]:
    """``(language, body)`` of every fenced block of a Markdown page."""
    return re.findall(r"^```(\w*)\n(.*?)^```", text, re.S | re.M)


def command_blocks() -> dict[tuple[str, str], tuple[str, str]]:
    """``{(page, first line[#n]): (kind, body)}`` for every command block; kind: shell | python.

    A first line repeated on one page gets ``#2``, ``#3``... in page order.
    """
    found: dict[tuple[str, str], tuple[str, str]] = {}
    for page in PAGES:
        rel = page.relative_to(REPO).as_posix()
        for lang, body in _fenced(page.read_text(encoding="utf-8")):
            lines = body.strip("\n").splitlines()
            if not lines:
                continue
            if lang == "python":
                kind = "python"
            elif lang in ("bash", "sh") or (
                lang == "" and COMMAND_WORDS.match(lines[0]) and "[OPTIONS]" not in lines[0]
            ):
                kind = "shell"
            else:
                continue
            key, n = (rel, lines[0]), 1
            while key in found:
                n += 1
                key = (rel, f"{lines[0]}#{n}")
            found[key] = (kind, body)
    return found


def test_every_command_block_is_run_or_says_why_not():
    blocks = command_blocks()
    listed = [*RUN, *ELSEWHERE, *NOT_RUN]
    assert len(set(RUN)) == len(RUN), "a block is listed twice in RUN"
    unlisted = [k for k in blocks if k not in listed]
    assert not unlisted, f"command blocks neither run nor explained (add them to RUN, ELSEWHERE or NOT_RUN): {unlisted}"
    stale = [k for k in listed if k not in blocks]
    assert not stale, f"entries naming no block (a page changed): {stale}"
    assert set(PROMISES) <= set(RUN)


# ------------------------------------------------------------------------------ running the blocks


def _join_continuations(script: str) -> list[str]:
    return script.replace("\\\n", " ").splitlines()


def _export_target(line: str) -> tuple[tuple[str, ...], str] | None:
    """``((model, other options...), out)`` of a ``masc-export`` line, else None."""
    if not line.startswith("masc-export "):
        return None
    argv = shlex.split(line, comments=True)[1:]
    out = argv[argv.index("--out") + 1]
    i = argv.index("--model")
    rest = [a for j, a in enumerate(argv) if j not in (i, i + 1) and a != "--out" and a != out]
    return (argv[i + 1], *rest), out


def _shell_script(body: str, bundles: dict[tuple[str, ...], Path]) -> str:
    """The block as run: ``pip install`` lines dropped, already-exported bundles linked."""
    lines = []
    for line in _join_continuations(body):
        if line.startswith("pip install"):
            continue
        target = _export_target(line)
        if target and target[0] in bundles:
            key, out = target
            lines.append(
                f"mkdir -p {shlex.quote(str(Path(out).parent))} && ln -s {shlex.quote(str(bundles[key]))} {shlex.quote(out)}"
            )
            continue
        lines.append(line)
    return "\n".join(lines) + "\n"


def _workspace(root: Path) -> Path:
    """A folder holding what a clone holds for the blocks, and a .venv recorded as set up."""
    for name in ("scripts", "constraints"):
        shutil.copytree(REPO / name, root / name)
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    (root / "examples").symlink_to(REPO / "examples")
    venv = root / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3*/site-packages"))
    here = [p for p in sys.path if p.endswith("site-packages")]
    # addsitedir, not a path line: the test environment's own .pth files (the editable install)
    # are read only from a site directory.
    (site / "_test_environment.pth").write_text("".join(f"import site; site.addsitedir({p!r})\n" for p in here))
    bindir = Path(sys.executable).parent
    for script in bindir.glob("masc-*"):
        (venv / "bin" / script.name).symlink_to(script)
    # The stamp scripts/setup_env.sh writes once it has installed (its "want" line), so its
    # second call, as the demo makes it, reports "up to date" without pip.
    want = subprocess.run(
        [
            "bash",
            "-c",
            'echo "$(cat scripts/setup_env.sh pyproject.toml constraints/ci.txt | sha256sum | cut -d" " -f1) '
            '$(.venv/bin/python --version 2>&1) $PWD"',
        ],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    (venv / ".masc-setup-runtime").write_text(want)
    return root


def _env(root: Path) -> dict:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PIP_NO_INDEX": "1", "NO_COLOR": "1"}
    env["PATH"] = f"{root / '.venv' / 'bin'}:{env['PATH']}"
    return env


def _run(kind: str, body: str, root: Path, bundles) -> subprocess.CompletedProcess:
    if kind == "python":
        (root / "block.py").write_text(body)
        argv = [str(root / ".venv" / "bin" / "python"), "block.py"]
    else:
        # Each block as a new terminal that first activates the demo's .venv, as the README says.
        argv = ["bash", "-e", "-o", "pipefail", "-c", ". .venv/bin/activate\n" + _shell_script(body, bundles)]
    # A hang guard only.
    return subprocess.run(argv, cwd=root, capture_output=True, text=True, timeout=900, env=_env(root))


@pytest.mark.slow
def test_the_run_blocks_run_as_pasted(tmp_path, request):
    blocks = command_blocks()
    bundles = {}
    for key, fixture in ALREADY_EXPORTED.items():
        if fixture.startswith("embedder_bundles["):
            bundles[key] = request.getfixturevalue("embedder_bundles")[fixture[len("embedder_bundles[") : -1]]
        else:
            bundles[key] = request.getfixturevalue(fixture)
    root = _workspace(tmp_path / "checkout")
    for key in RUN:
        kind, body = blocks[key]
        done = _run(kind, body, root, bundles)
        said = done.stdout + done.stderr
        assert "Traceback (most recent call last)" not in said, (key, said[-3000:])
        if key in REFUSED_HERE and not _can_run(REFUSED_HERE[key][0]):
            assert done.returncode != 0 and re.search(REFUSED_HERE[key][1], said), (key, said[-3000:])
            continue
        assert done.returncode == 0, (key, said[-3000:])
        promised = PROMISES.get(key, ())
        for pattern in (promised,) if isinstance(promised, str) else promised:
            assert re.search(pattern, said, re.M), (key, pattern, said[-3000:])
