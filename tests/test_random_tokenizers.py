"""The random checkpoints' test tokenizers are the same in every process (export/random_tokenizers.py)."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from collections import Counter

import pytest

from masc_engine.export.random_tokenizers import _learn_merges


def test_merges_take_the_most_frequent_pair_and_break_ties_by_the_pair_strings():
    words = Counter({("c", "d</w>"): 2, ("x", "y", "z</w>"): 3, ("a", "b</w>"): 2})
    assert _learn_merges(words, 10) == [("x", "y"), ("xy", "z</w>"), ("a", "b</w>"), ("c", "d</w>")]
    # the same corpus in another order: the same merges (a dict's order decides nothing)
    assert _learn_merges(Counter(dict(reversed(list(words.items())))), 10) == _learn_merges(words, 10)
    assert _learn_merges(words, 1) == [("x", "y")]
    # a pair seen once is not merged; overlapping pairs merge left to right, as BPE applies them
    assert _learn_merges(Counter({("q", "r</w>"): 1}), 10) == []
    assert _learn_merges(Counter({("a", "a", "a</w>"): 2}), 10)[0] == ("a", "a")


_TRAIN = (
    "import hashlib, sys, tempfile; from pathlib import Path; "
    "from masc_engine.export.random_tokenizers import _train_clip_tokenizer; "
    "d = Path(tempfile.mkdtemp()); _train_clip_tokenizer(d); "
    "print(hashlib.sha256((d / 'tokenizer.json').read_bytes()).hexdigest())"
)


@pytest.mark.slow
def test_the_clip_layout_tokenizer_is_the_same_in_every_process():
    """tokenizers' BpeTrainer with an end-of-word suffix learned different merges in different
    processes (hash-map order breaking ties); three processes, one tokenizer file."""
    pytest.importorskip("transformers")
    digests = {
        subprocess.run([sys.executable, "-c", _TRAIN], capture_output=True, text=True, check=True).stdout.split()[-1]
        for _ in range(3)
    }
    assert len(digests) == 1, digests
    assert all(len(d) == len(hashlib.sha256().hexdigest()) for d in digests)
