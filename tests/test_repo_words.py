"""The repository speaks of the product: no sentence cites a tracker's issue numbers or tells who
wrote what with which hardware. Such words are replaced by the requirement, the measurement or the
verification status (docs/verification.md says what has run where)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FOLDERS = ("src", "tests", "bench", "docs", "scripts")
FILES = ("README.md", "pyproject.toml")
SUFFIXES = {".py", ".md", ".sh", ".json", ".txt", ".toml", ".cfg", ".ini", ".yaml", ".yml", ".csv", ".html"}

#: Case-insensitive patterns of words about how the code was made, each with why it is refused.
FORBIDDEN = {
    r"\bissues? #?[0-9]": "an issue number (a reader has no tracker): state the requirement",
    r"\bthat wrote\b": "who wrote it: state the verification status",
    r"\blent\b|\bloan(s|ed)?\b": "borrowed hardware: state what ran where",
    r"\bthis session\b|\bsessions? (so far|that (wrote|holds?|had))\b|\bno session had\b|\bsession's time\b|"
    r"\bother sessions\b": "a work session (ONNX Runtime sessions are fine): state the measurement or the status",
    r"\bhelpers?'|\bother helpers\b|\bhelpers? (session|engineer|job)s?\b|\bhelpers? (ran|wrote)\b": "people as helpers: state what ran",
}
#: Upstream trackers a reader can open (``uvicorn issue #157``) are citations, not our history.
UPSTREAM = re.compile(
    r"\b(uvicorn|onnxruntime|onnx|tensorrt|pytorch|torch|transformers|pillow|click|tqdm|ray|"
    r"fastapi|starlette|numpy|cupy|openvino)(['’]s)? issues? #[0-9]",
    re.I,
)


def _files():
    me = Path(__file__).resolve()
    for folder in FOLDERS:
        for p in sorted((REPO / folder).rglob("*")):
            if p.is_file() and p.suffix in SUFFIXES and p.resolve() != me and "__pycache__" not in p.parts:
                yield p
    for name in FILES:
        yield REPO / name


def test_no_words_about_how_the_code_was_made():
    found = []
    for path in _files():
        text = path.read_text(encoding="utf-8", errors="replace")
        for pattern, why in FORBIDDEN.items():
            for m in re.finditer(pattern, text, re.I):
                line_start = text.rfind("\n", 0, m.start()) + 1
                line = text[line_start : text.find("\n", m.end())]
                if UPSTREAM.search(line):
                    continue
                n = text.count("\n", 0, m.start()) + 1
                found.append(f"{path.relative_to(REPO)}:{n}: {m.group(0)!r} ({why}): {line.strip()[:120]}")
    assert not found, "\n".join(found)


def test_the_check_sees_each_kind():
    for sample in (
        "int8 gates (issue 4)",
        "unverified by the session that wrote it",
        "on the lent GPU",
        "no session had a GPU",
        "shared with other helpers' jobs",
    ):
        assert any(re.search(p, sample, re.I) for p in FORBIDDEN), sample
    for fine in (
        "an ONNX Runtime session per graph",
        "numpy_helper.from_array",
        "onnx.helper.make_node",
        "equivalent",
        "silently",
        "a CUDA session",
        "cheap: no session is made",
        "no session warm-up",
    ):
        assert not any(re.search(p, fine, re.I) for p in FORBIDDEN), fine
