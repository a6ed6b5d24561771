"""A tokenizer.json whose ids pass the text tower's vocabulary is the bundle's one-line refusal:
at load when the manifest records ``text.vocab_size``, at the first prompt otherwise (it was an
ONNX Runtime ``Gather`` traceback that lost the run)."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

EX = Path(__file__).resolve().parents[1] / "examples" / "dreambooth"


def _hostile_copy(naflex_bundle: Path, tmp_path: Path, record_vocab: bool) -> Path:
    """The bundle with a WordLevel tokenizer whose ids are in the billions (its hash updated)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    b = tmp_path / "b"
    shutil.copytree(naflex_bundle, b)
    words = "a cat on the beach backpack in jungle dog teapot <pad> <unk>".split()
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    # the ids moved into the billions in the JSON: tokenizers' own save of such a vocabulary
    # takes ~30 s (it lays the vocabulary out by id); loading it is immediate
    spec = json.loads(tok.to_str())
    spec["model"]["vocab"] = {w: 2_000_000_000 + i for w, i in spec["model"]["vocab"].items()}
    (b / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    assert Tokenizer.from_file(str(b / "tokenizer.json")).token_to_id("cat") == 2_000_000_001
    m = json.loads((b / "manifest.json").read_text())
    m["files"]["tokenizer.json"] = hashlib.sha256((b / "tokenizer.json").read_bytes()).hexdigest()
    if record_vocab:
        m["text"]["vocab_size"] = 420
    else:
        m["text"].pop("vocab_size", None)
    (b / "manifest.json").write_text(json.dumps(m))
    return b


def test_manifest_records_the_text_vocabulary(naflex_bundle):
    m = json.loads((naflex_bundle / "manifest.json").read_text())
    assert m["text"]["vocab_size"] == 420  # the tiny preset's trained test tokenizer


@pytest.mark.parametrize("record_vocab", [True, False])
@pytest.mark.slow
def test_tokenizer_past_the_vocabulary_is_one_line(naflex_bundle, tmp_path, record_vocab):
    b = _hostile_copy(naflex_bundle, tmp_path, record_vocab)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "masc_engine.cli.run_cmd",
            str(EX / "pairs.csv"),
            "--bundle",
            str(b),
            "--out",
            str(tmp_path / "s.csv"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    err = [ln for ln in r.stderr.splitlines() if ln.startswith("Error:")]
    assert r.returncode == 1 and len(err) == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert ("past the text tower's vocabulary" if record_vocab else "token ids up to") in err[0]
