"""Tests for masc_engine.runtime.stripping, the torch-free port of masc-metric
0.3.0's masc/text.py (and MaSC._pf_prompt from masc/metric.py).

Three kinds of test:

- known values, which need nothing but this module;
- oracle tests (marker `oracle`), which compare against masc-metric 0.3.0 and
  skip when it (and so torch) is not importable; the oracle is only imported
  inside those tests, so this module collects without torch;
- spaCy tests, which skip when spaCy is missing. en_core_web_sm is not on PyPI,
  so the spaCy rule is checked on hand-built parses (a fake pipeline returning
  `Doc`s with fixed words, heads, deps, POS and lemmas), fed to both our
  stripper and the oracle's. Only the tests that need the real model skip
  without it.
"""

from __future__ import annotations

import importlib

import csv
import functools
import os
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest

from support import photo_sets
from masc_engine.runtime import stripping
from masc_engine.runtime.stripping import (
    STRIPPERS,
    SpacySubjectStripper,
    pf_prompt,
    strip_subject_from_prompt,
)

REPO = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------


@pytest.fixture(scope="module", params=photo_sets())
def dreambooth_rows(request) -> list[tuple[str, str]]:
    """(prompt, object_name) of every row of a real pairs.csv: the shipped examples, and the
    shared set when present beside the checkout (support.photo_sets)."""
    path = request.param / "pairs.csv"
    with path.open(newline="", encoding="utf-8-sig") as f:
        rows = [(r["prompt"], r["object_name"]) for r in csv.DictReader(f)]
    assert rows, f"{path} has no rows"
    return rows


# (prompt, object_name, expected output of the regex stripper)
REGEX_CASES = [
    # the docstring example
    (
        "A photo of a kitten chasing a butterfly in a sunny garden",
        "kitten",
        "A photo of chasing a butterfly in a sunny garden",
    ),
    ("an owl at night", "owl", "at night"),
    ("kitten in a basket", "kitten", "in a basket"),
    ("The kitten sleeps", "kitten", "sleeps"),
    # regex metacharacters are literal
    ("a c++ toy on a desk", "c++ toy", "on a desk"),
    ("my c++ toy on a desk", "c++ toy", "my on a desk"),
    ("a kitten on a sofa", "k.tten", "a kitten on a sofa"),
    ("a cat and a dog", "dog|cat", "a cat and a dog"),
    ("a (red) car in the rain", "(red) car", "in the rain"),
    # a name ending in a non-word character needs a word character after it
    # (trailing \b), so this mention is not found
    ("a toy c++ on a desk", "toy c++", "a toy c++ on a desk"),
    # hyphens
    ("a teddy-bear on a bed", "teddy-bear", "on a bed"),
    ("a hot-dog stand", "dog", "a hot- stand"),
    ("a red rc-car", "rc-car", "a red"),
    # multi-word names; the name's single space must match exactly
    ("a stuffed animal on a bed", "stuffed animal", "on a bed"),
    ("a Stuffed Animal next to a stuffed animal", "stuffed animal", "next to"),
    ("a stuffed  animal on a bed", "stuffed animal", "a stuffed animal on a bed"),
    ("a piggy bank full of coins", "piggy bank", "full of coins"),
    # case
    ("A KITTEN on a sofa", "kitten", "on a sofa"),
    ("a kitten on a sofa", "KITTEN", "on a sofa"),
    ("The Kitten and the kitten", "kitten", "and"),
    # several mentions: every "(a|an|the) <name>" goes; when that pattern
    # matched, bare mentions stay
    ("a kitten next to a kitten", "kitten", "next to"),
    ("a kitten next to another kitten", "kitten", "next to another kitten"),
    ("an apple, the apple and Apple", "apple", ", and Apple"),
    ("kitten and kitten", "kitten", "and"),
    # possessive: regex keeps the marker
    ("the dog's ball on the grass", "dog", "'s ball on the grass"),
    # no mention / no inflection handling
    ("a cat on a sofa", "kitten", "a cat on a sofa"),
    ("two kittens playing", "kitten", "two kittens playing"),
    ("the theatre kitten", "kitten", "the theatre"),
    ("", "kitten", ""),
    # empty / whitespace names match nothing but still collapse whitespace
    ("a  kitten\ton a sofa ", "", "a kitten on a sofa"),
    ("a  kitten\ton a sofa ", "   ", "a kitten on a sofa"),
    # the name's outer whitespace is ignored
    ("a kitten on a sofa", "  kitten\t", "on a sofa"),
    ("a kitten on a sofa", "a kitten", "on a sofa"),
    # extra whitespace in the prompt
    ("  a   kitten\tin the\nsnow  ", "kitten", "in the snow"),
    ("a kitten,   in the snow", "kitten", ", in the snow"),
    # non-ASCII
    ("a piñata hanging from a tree", "piñata", "hanging from a tree"),
    ("A PIÑATA", "piñata", ""),
    ("ein Hund im Schnee", "hund", "ein im Schnee"),
    ("a café in Paris", "café", "in Paris"),
    ("a cafés terrace", "café", "a cafés terrace"),
    ("一只猫 on a sofa", "一只猫", "on a sofa"),
]

OBJECT_NAMES_EXTRA = ["", "   ", "\t", "kitten", "c++ toy", "stuffed animal", "teddy-bear"]


# --------------------------------------------------------------------------
# Known values (no oracle needed)
# --------------------------------------------------------------------------


def test_strippers_tuple():
    assert STRIPPERS == ("regex", "spacy", "none")


@pytest.mark.parametrize("prompt,object_name,expected", REGEX_CASES)
def test_regex_known_values(prompt, object_name, expected):
    assert strip_subject_from_prompt(prompt, object_name) == expected
    assert strip_subject_from_prompt(prompt, object_name, "regex") == expected


@pytest.mark.parametrize("prompt,object_name,_", REGEX_CASES)
def test_none_stripper_returns_prompt_unchanged(prompt, object_name, _):
    assert strip_subject_from_prompt(prompt, object_name, "none") is prompt


def test_none_stripper_ignores_none_object_name():
    assert strip_subject_from_prompt("a  kitten ", None, "none") == "a  kitten "


def test_regex_rejects_none_object_name():
    with pytest.raises(AttributeError):
        strip_subject_from_prompt("a kitten", None)


@pytest.mark.parametrize("bad", ["Regex", "", "nltk", None])
def test_unknown_stripper_raises_value_error(bad):
    with pytest.raises(ValueError, match="Unknown stripper"):
        strip_subject_from_prompt("a kitten", "kitten", bad)
    with pytest.raises(ValueError, match="stripper must be one of"):
        pf_prompt("a kitten", "kitten", bad)
    # MaSC validates the stripper in its constructor, before any prompt
    with pytest.raises(ValueError):
        pf_prompt("a kitten", None, bad)


def test_pf_prompt_known_values():
    assert pf_prompt("a kitten on a sofa", "kitten", "regex") == (
        "on a sofa",
        {"prompt_stripped": True, "stripper": "regex", "stripper_model": None},
    )
    # no mention: whitespace collapsed, but not counted as stripped
    assert pf_prompt("a  cat on a sofa ", "kitten", "regex") == (
        "a cat on a sofa",
        {"prompt_stripped": False, "stripper": "regex", "stripper_model": None},
    )
    assert pf_prompt("a  kitten ", "kitten", "none") == (
        "a  kitten ",
        {"prompt_stripped": False, "stripper": "none", "stripper_model": None},
    )
    # no object name: prompt as given, stripper None, whatever the stripper
    for name in (None, "", "  \t"):
        for s in STRIPPERS:
            assert pf_prompt("a  kitten ", name, s) == (
                "a  kitten ",
                {"prompt_stripped": False, "stripper": None, "stripper_model": None},
            )


@pytest.mark.slow
def test_module_is_torch_and_masc_free():
    code = (
        "import sys\n"
        "import masc_engine.runtime.stripping as s\n"
        "assert s.strip_subject_from_prompt('a kitten here', 'kitten') == 'here'\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'masc', 'spacy'))\n"
        "assert not bad, bad\n"
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "src"), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


# --------------------------------------------------------------------------
# Oracle: masc-metric 0.3.0, regex and none strippers, pf_prompt
# --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def oracle():
    """masc.text and masc.metric (imports torch)."""
    pytest.importorskip("torch", reason="the masc-metric oracle needs torch")
    masc = pytest.importorskip("masc", reason="masc-metric 0.3.0 is the oracle")
    metric, text = (importlib.import_module(f"masc.{m}") for m in ("metric", "text"))

    version = getattr(masc, "__version__", None)
    if version is not None:
        assert version == "0.3.0", f"oracle is masc-metric {version}, expected 0.3.0"
    return SimpleNamespace(text=text, metric=metric)


def _oracle_pf_prompt(oracle, prompt, object_name, stripper, stripper_model=None):
    # MaSC._pf_prompt only reads self.stripper and self.stripper_model.
    fake_self = SimpleNamespace(stripper=stripper, stripper_model=stripper_model)
    return oracle.metric.MaSC._pf_prompt(fake_self, prompt, object_name)


def _hand_pairs():
    pairs = [(p, o) for p, o, _ in REGEX_CASES]
    prompts = sorted({p for p, _ in pairs})
    pairs += [(p, o) for p in prompts for o in OBJECT_NAMES_EXTRA]
    return pairs


@pytest.mark.oracle
@pytest.mark.parametrize("stripper", ["regex", "none"])
def test_oracle_dreambooth_all_rows(oracle, stripper, dreambooth_rows):
    rows = dreambooth_rows
    n_stripped = 0
    for prompt, object_name in rows:
        ours = strip_subject_from_prompt(prompt, object_name, stripper)
        ref = oracle.text.strip_subject_from_prompt(prompt, object_name, stripper)
        assert ours == ref, (prompt, object_name)
        n_stripped += ours.split() != prompt.split()
    # every DreamBooth prompt names its subject; the regex stripper finds all
    assert n_stripped == (len(rows) if stripper == "regex" else 0)


@pytest.mark.oracle
def test_oracle_dreambooth_cross_subjects(oracle, dreambooth_rows):
    """Every prompt against every subject name: mostly no-mention cases."""
    rows = dreambooth_rows
    names = sorted({o for _, o in rows}) + OBJECT_NAMES_EXTRA
    prompts = sorted({p for p, _ in rows})
    for prompt in prompts:
        for name in names:
            assert strip_subject_from_prompt(prompt, name) == oracle.text.strip_subject_from_prompt(prompt, name), (
                prompt,
                name,
            )


@pytest.mark.oracle
@pytest.mark.parametrize("stripper", ["regex", "none"])
def test_oracle_hand_cases(oracle, stripper):
    for prompt, object_name in _hand_pairs():
        assert strip_subject_from_prompt(prompt, object_name, stripper) == oracle.text.strip_subject_from_prompt(
            prompt, object_name, stripper
        ), (prompt, object_name)


@pytest.mark.oracle
def test_oracle_none_object_name_behaviour(oracle):
    ref = oracle.text.strip_subject_from_prompt
    assert strip_subject_from_prompt("a  kitten", None, "none") == ref("a  kitten", None, "none")
    with pytest.raises(AttributeError):
        ref("a kitten", None, "regex")
    with pytest.raises(AttributeError):
        strip_subject_from_prompt("a kitten", None, "regex")


@pytest.mark.oracle
def test_oracle_unknown_stripper_message(oracle):
    with pytest.raises(ValueError) as ours:
        strip_subject_from_prompt("a kitten", "kitten", "nltk")
    with pytest.raises(ValueError) as ref:
        oracle.text.strip_subject_from_prompt("a kitten", "kitten", "nltk")
    assert str(ours.value) == str(ref.value)


@pytest.mark.oracle
@pytest.mark.parametrize("stripper", ["regex", "none"])
def test_oracle_pf_prompt(oracle, stripper, dreambooth_rows):
    pairs = dreambooth_rows + _hand_pairs()
    pairs += [(p, None) for p, _, _ in REGEX_CASES]
    for prompt, object_name in pairs:
        ours = pf_prompt(prompt, object_name, stripper)
        ref = _oracle_pf_prompt(oracle, prompt, object_name, stripper)
        assert ours == ref, (prompt, object_name)
        assert type(ours[1]["prompt_stripped"]) is bool
        assert list(ours[1]) == ["prompt_stripped", "stripper", "stripper_model"]


# --------------------------------------------------------------------------
# spaCy: hand-built parses
# --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def spacy():
    return pytest.importorskip("spacy", reason="spaCy is not installed (extra: masc-engine[spacy])")


# token: (word, lemma, POS, dep, absolute head index)
def _tok(word, lemma, pos, dep, head):
    return (word, lemma, pos, dep, head)


# Parses in the style of en_core_web_sm, written out so the spaCy rule is
# exercised without the model. Object-name parses are included.
PARSES = {
    "kitten": [_tok("kitten", "kitten", "NOUN", "ROOT", 0)],
    "dog": [_tok("dog", "dog", "NOUN", "ROOT", 0)],
    "motorcycle": [_tok("motorcycle", "motorcycle", "NOUN", "ROOT", 0)],
    "dolphin": [_tok("dolphin", "dolphin", "NOUN", "ROOT", 0)],
    "piñata": [_tok("piñata", "piñata", "NOUN", "ROOT", 0)],
    "": [],
    "bouquet of flowers": [
        _tok("bouquet", "bouquet", "NOUN", "ROOT", 0),
        _tok("of", "of", "ADP", "prep", 0),
        _tok("flowers", "flower", "NOUN", "pobj", 1),
    ],
    "stuffed animal": [
        _tok("stuffed", "stuffed", "ADJ", "amod", 1),
        _tok("animal", "animal", "NOUN", "ROOT", 1),
    ],
    "cherry blossom": [
        _tok("cherry", "cherry", "NOUN", "compound", 1),
        _tok("blossom", "blossom", "NOUN", "ROOT", 1),
    ],
    "a fluffy little kitten chasing a butterfly": [
        _tok("a", "a", "DET", "det", 3),
        _tok("fluffy", "fluffy", "ADJ", "amod", 3),
        _tok("little", "little", "ADJ", "amod", 3),
        _tok("kitten", "kitten", "NOUN", "ROOT", 3),
        _tok("chasing", "chase", "VERB", "acl", 3),
        _tok("a", "a", "DET", "det", 6),
        _tok("butterfly", "butterfly", "NOUN", "dobj", 4),
    ],
    "A photo of a fluffy little kitten chasing a butterfly in a sunny garden": [
        _tok("A", "a", "DET", "det", 1),
        _tok("photo", "photo", "NOUN", "ROOT", 1),
        _tok("of", "of", "ADP", "prep", 1),
        _tok("a", "a", "DET", "det", 6),
        _tok("fluffy", "fluffy", "ADJ", "amod", 6),
        _tok("little", "little", "ADJ", "amod", 6),
        _tok("kitten", "kitten", "NOUN", "pobj", 2),
        _tok("chasing", "chase", "VERB", "acl", 6),
        _tok("a", "a", "DET", "det", 9),
        _tok("butterfly", "butterfly", "NOUN", "dobj", 7),
        _tok("in", "in", "ADP", "prep", 7),
        _tok("a", "a", "DET", "det", 13),
        _tok("sunny", "sunny", "ADJ", "amod", 13),
        _tok("garden", "garden", "NOUN", "pobj", 10),
    ],
    "the dog's ball on the grass": [
        _tok("the", "the", "DET", "det", 1),
        _tok("dog", "dog", "NOUN", "poss", 3),
        _tok("'s", "'s", "PART", "case", 1),
        _tok("ball", "ball", "NOUN", "ROOT", 3),
        _tok("on", "on", "ADP", "prep", 3),
        _tok("the", "the", "DET", "det", 6),
        _tok("grass", "grass", "NOUN", "pobj", 4),
    ],
    "a motorcycle rider on a road": [
        _tok("a", "a", "DET", "det", 2),
        _tok("motorcycle", "motorcycle", "NOUN", "compound", 2),
        _tok("rider", "rider", "NOUN", "ROOT", 2),
        _tok("on", "on", "ADP", "prep", 2),
        _tok("a", "a", "DET", "det", 5),
        _tok("road", "road", "NOUN", "pobj", 3),
    ],
    # the mis-parse: "dolphin swimming" as a compound noun
    "a dolphin swimming in the ocean": [
        _tok("a", "a", "DET", "det", 2),
        _tok("dolphin", "dolphin", "NOUN", "compound", 2),
        _tok("swimming", "swimming", "NOUN", "ROOT", 2),
        _tok("in", "in", "ADP", "prep", 2),
        _tok("the", "the", "DET", "det", 5),
        _tok("ocean", "ocean", "NOUN", "pobj", 3),
    ],
    # same, with an adjective before the mention hanging off the later word
    "a happy dolphin swimming": [
        _tok("a", "a", "DET", "det", 3),
        _tok("happy", "happy", "ADJ", "amod", 3),
        _tok("dolphin", "dolphin", "NOUN", "compound", 3),
        _tok("swimming", "swimming", "NOUN", "ROOT", 3),
    ],
    # the later word is a noun, but does not directly follow the mention
    "the dolphin and orca trainer": [
        _tok("the", "the", "DET", "det", 4),
        _tok("dolphin", "dolphin", "NOUN", "compound", 4),
        _tok("and", "and", "CCONJ", "cc", 1),
        _tok("orca", "orca", "NOUN", "conj", 1),
        _tok("trainer", "trainer", "NOUN", "ROOT", 4),
    ],
    # a name whose words repeat: mentions do not overlap
    "la la la land": [
        _tok("la", "la", "PROPN", "compound", 3),
        _tok("la", "la", "PROPN", "compound", 3),
        _tok("la", "la", "PROPN", "compound", 3),
        _tok("land", "land", "PROPN", "ROOT", 3),
    ],
    "la la": [
        _tok("la", "la", "PROPN", "compound", 1),
        _tok("la", "la", "PROPN", "ROOT", 1),
    ],
    "the bouquet on a wooden table": [
        _tok("the", "the", "DET", "det", 1),
        _tok("bouquet", "bouquet", "NOUN", "ROOT", 1),
        _tok("on", "on", "ADP", "prep", 1),
        _tok("a", "a", "DET", "det", 5),
        _tok("wooden", "wooden", "ADJ", "amod", 5),
        _tok("table", "table", "NOUN", "pobj", 2),
    ],
    "two Kittens playing with yarn": [
        _tok("two", "two", "NUM", "nummod", 1),
        _tok("Kittens", "kitten", "NOUN", "ROOT", 1),
        _tok("playing", "play", "VERB", "acl", 1),
        _tok("with", "with", "ADP", "prep", 2),
        _tok("yarn", "yarn", "NOUN", "pobj", 3),
    ],
    "a kitten and a puppy": [
        _tok("a", "a", "DET", "det", 1),
        _tok("kitten", "kitten", "NOUN", "ROOT", 1),
        _tok("and", "and", "CCONJ", "cc", 1),
        _tok("a", "a", "DET", "det", 4),
        _tok("puppy", "puppy", "NOUN", "conj", 1),
    ],
    "a small, fluffy kitten, sitting on a rug": [
        _tok("a", "a", "DET", "det", 4),
        _tok("small", "small", "ADJ", "amod", 4),
        _tok(",", ",", "PUNCT", "punct", 4),
        _tok("fluffy", "fluffy", "ADJ", "amod", 4),
        _tok("kitten", "kitten", "NOUN", "ROOT", 4),
        _tok(",", ",", "PUNCT", "punct", 4),
        _tok("sitting", "sit", "VERB", "acl", 4),
        _tok("on", "on", "ADP", "prep", 6),
        _tok("a", "a", "DET", "det", 9),
        _tok("rug", "rug", "NOUN", "pobj", 7),
    ],
    "a kitten next to another kitten": [
        _tok("a", "a", "DET", "det", 1),
        _tok("kitten", "kitten", "NOUN", "ROOT", 1),
        _tok("next", "next", "ADV", "advmod", 1),
        _tok("to", "to", "ADP", "prep", 2),
        _tok("another", "another", "DET", "det", 5),
        _tok("kitten", "kitten", "NOUN", "pobj", 3),
    ],
    "a cat on a sofa": [
        _tok("a", "a", "DET", "det", 1),
        _tok("cat", "cat", "NOUN", "ROOT", 1),
        _tok("on", "on", "ADP", "prep", 1),
        _tok("a", "a", "DET", "det", 4),
        _tok("sofa", "sofa", "NOUN", "pobj", 2),
    ],
    "a stuffed animal on its bed": [
        _tok("a", "a", "DET", "det", 2),
        _tok("stuffed", "stuffed", "ADJ", "amod", 2),
        _tok("animal", "animal", "NOUN", "ROOT", 2),
        _tok("on", "on", "ADP", "prep", 2),
        _tok("its", "its", "PRON", "poss", 5),
        _tok("bed", "bed", "NOUN", "pobj", 3),
    ],
    "cherry blossoms in spring": [
        _tok("cherry", "cherry", "NOUN", "compound", 1),
        _tok("blossoms", "blossom", "NOUN", "ROOT", 1),
        _tok("in", "in", "ADP", "prep", 1),
        _tok("spring", "spring", "NOUN", "pobj", 2),
    ],
    "a beach at sunset with a kitten, waves behind": [
        _tok("a", "a", "DET", "det", 1),
        _tok("beach", "beach", "NOUN", "ROOT", 1),
        _tok("at", "at", "ADP", "prep", 1),
        _tok("sunset", "sunset", "NOUN", "pobj", 2),
        _tok("with", "with", "ADP", "prep", 1),
        _tok("a", "a", "DET", "det", 6),
        _tok("kitten", "kitten", "NOUN", "pobj", 4),
        _tok(",", ",", "PUNCT", "punct", 1),
        _tok("waves", "wave", "NOUN", "appos", 1),
        _tok("behind", "behind", "ADV", "advmod", 8),
    ],
    # extra whitespace becomes SPACE tokens, as spaCy's tokenizer makes them
    "a  kitten   in the snow": [
        _tok("a", "a", "DET", "det", 2),
        _tok(" ", " ", "SPACE", "dep", 0),
        _tok("kitten", "kitten", "NOUN", "ROOT", 2),
        _tok("  ", "  ", "SPACE", "dep", 2),
        _tok("in", "in", "ADP", "prep", 2),
        _tok("the", "the", "DET", "det", 6),
        _tok("snow", "snow", "NOUN", "pobj", 4),
    ],
    "a Piñata hanging from a tree": [
        _tok("a", "a", "DET", "det", 1),
        _tok("Piñata", "piñata", "PROPN", "ROOT", 1),
        _tok("hanging", "hang", "VERB", "acl", 1),
        _tok("from", "from", "ADP", "prep", 2),
        _tok("a", "a", "DET", "det", 5),
        _tok("tree", "tree", "NOUN", "pobj", 3),
    ],
    "a kitten playing with its tail": [
        _tok("a", "a", "DET", "det", 1),
        _tok("kitten", "kitten", "NOUN", "ROOT", 1),
        _tok("playing", "play", "VERB", "acl", 1),
        _tok("with", "with", "ADP", "prep", 2),
        _tok("its", "its", "PRON", "poss", 5),
        _tok("tail", "tail", "NOUN", "pobj", 3),
    ],
}

# (prompt, object_name, expected output of the spaCy stripper on PARSES)
SPACY_CASES = [
    ("a fluffy little kitten chasing a butterfly", "kitten", "chasing a butterfly"),
    (
        "A photo of a fluffy little kitten chasing a butterfly in a sunny garden",
        "kitten",
        "A photo of chasing a butterfly in a sunny garden",
    ),
    ("the dog's ball on the grass", "dog", "ball on the grass"),
    ("a motorcycle rider on a road", "motorcycle", "a rider on a road"),
    ("a dolphin swimming in the ocean", "dolphin", "swimming in the ocean"),
    ("a happy dolphin swimming", "dolphin", "swimming"),
    ("the dolphin and orca trainer", "dolphin", "and orca trainer"),
    ("la la la land", "la la", "la land"),
    ("the bouquet on a wooden table", "bouquet of flowers", "on a wooden table"),
    ("two Kittens playing with yarn", "kitten", "playing with yarn"),
    ("a kitten and a puppy", "kitten", "and a puppy"),
    ("a small, fluffy kitten, sitting on a rug", "kitten", "sitting on a rug"),
    ("a kitten next to another kitten", "kitten", "next to"),
    ("a cat on a sofa", "kitten", "a cat on a sofa"),
    ("a stuffed animal on its bed", "stuffed animal", "on its bed"),
    ("cherry blossoms in spring", "cherry blossom", "in spring"),
    ("a beach at sunset with a kitten, waves behind", "kitten", "a beach at sunset with, waves behind"),
    ("a  kitten   in the snow", "kitten", "in the snow"),
    ("a Piñata hanging from a tree", "piñata", "hanging from a tree"),
    ("a kitten playing with its tail", "kitten", "playing with its tail"),
]

FAKE_META = {"lang": "en", "name": "core_web_sm", "version": "3.8.0"}


@functools.lru_cache(maxsize=None)
def _blank_vocab(spacy_mod):
    return spacy_mod.blank("en").vocab


class FakeNLP:
    """A pipeline stand-in: returns the hand-built parse of each known text."""

    def __init__(self, spacy_mod, parses=PARSES, meta=FAKE_META):
        self.vocab = _blank_vocab(spacy_mod)
        self.parses = parses
        self.meta = dict(meta)
        self.calls: list[str] = []

    def __call__(self, text: str):
        from spacy.tokens import Doc

        self.calls.append(text)
        toks = self.parses[text]  # KeyError: a parse the test did not provide
        words, spaces, pos = [], [], 0
        for word, *_ in toks:
            assert text.startswith(word, pos), (text, word, pos)
            pos += len(word)
            space = not word.isspace() and text[pos : pos + 1] == " "
            pos += space
            words.append(word)
            spaces.append(space)
        assert pos == len(text), (text, pos)
        if not toks:
            return Doc(self.vocab, words=[])
        doc = Doc(
            self.vocab,
            words=words,
            spaces=spaces,
            lemmas=[t[1] for t in toks],
            pos=[t[2] for t in toks],
            deps=[t[3] for t in toks],
            heads=[t[4] for t in toks],
        )
        assert doc.text == text
        return doc


@pytest.fixture
def fake_nlp(spacy):
    return FakeNLP(spacy)


@pytest.mark.parametrize("prompt,object_name,expected", SPACY_CASES)
def test_spacy_rule_known_values(fake_nlp, prompt, object_name, expected):
    assert SpacySubjectStripper(fake_nlp).strip(prompt, object_name) == expected


PRE_MODIFIER_LABELS = ["det", "predet", "poss", "nummod", "quantmod", "amod", "compound", "nmod", "nn"]


@pytest.mark.parametrize(
    "label,expected",
    [
        *[(label, "sleeping") for label in PRE_MODIFIER_LABELS],
        ("advmod", "tabby sleeping"),
        ("punct", "tabby sleeping"),
    ],
)
def test_spacy_pre_modifier_labels(spacy, label, expected):
    """Rule 2: the left dependents removed with the mention, label by label."""
    parses = {
        "kitten": PARSES["kitten"],
        "tabby kitten sleeping": [
            _tok("tabby", "tabby", "ADJ", label, 1),
            _tok("kitten", "kitten", "NOUN", "ROOT", 1),
            _tok("sleeping", "sleep", "VERB", "acl", 1),
        ],
    }
    nlp = FakeNLP(spacy, parses)
    assert SpacySubjectStripper(nlp).strip("tabby kitten sleeping", "kitten") == expected


@pytest.mark.parametrize(
    "label,expected",
    [
        ("amod", "swimming"),
        ("compound", "swimming"),
        ("nmod", "swimming"),
        ("nn", "swimming"),
        ("dep", "a swimming"),
        ("nsubj", "a swimming"),
    ],
)
def test_spacy_modifier_of_later_word_labels(spacy, label, expected):
    """Rule 2: a mention hanging off a later "-ing" word takes the later
    word's determiner with it only through the modifier relations."""
    parses = {
        "dolphin": PARSES["dolphin"],
        "a dolphin swimming": [
            _tok("a", "a", "DET", "det", 2),
            _tok("dolphin", "dolphin", "NOUN", label, 2),
            _tok("swimming", "swimming", "NOUN", "ROOT", 2),
        ],
    }
    nlp = FakeNLP(spacy, parses)
    assert SpacySubjectStripper(nlp).strip("a dolphin swimming", "dolphin") == expected


def test_spacy_keeps_non_np_left_dependents_of_the_mention(spacy):
    """Climbing to a later word never widens the span over the mention's own
    subtree: the quote (punct) attached to the mention stays."""
    prompt = '"dolphin" swimming lesson'
    parses = {
        "dolphin": PARSES["dolphin"],
        prompt: [
            _tok('"', '"', "PUNCT", "punct", 1),
            _tok("dolphin", "dolphin", "NOUN", "compound", 3),
            _tok('"', '"', "PUNCT", "punct", 1),
            _tok("swimming", "swimming", "NOUN", "compound", 4),
            _tok("lesson", "lesson", "NOUN", "ROOT", 4),
        ],
    }
    nlp = FakeNLP(spacy, parses)
    assert SpacySubjectStripper(nlp).strip(prompt, "dolphin") == '"" swimming lesson'


def test_spacy_find_mentions(fake_nlp):
    s = SpacySubjectStripper(fake_nlp)
    assert s.find_mentions(fake_nlp("a kitten next to another kitten"), "kitten") == [(1, 2), (5, 6)]
    assert s.find_mentions(fake_nlp("two Kittens playing with yarn"), "kitten") == [(1, 2)]
    assert s.find_mentions(fake_nlp("cherry blossoms in spring"), "cherry blossom") == [(0, 2)]
    assert s.find_mentions(fake_nlp("la la la land"), "la la") == [(0, 2)]
    # head-noun fallback for a multi-word name
    assert s.find_mentions(fake_nlp("the bouquet on a wooden table"), "bouquet of flowers") == [(1, 2)]
    assert s.find_mentions(fake_nlp("a cat on a sofa"), "kitten") == []
    assert s.find_mentions(fake_nlp("a cat on a sofa"), "") == []


def test_spacy_strip_with_empty_name_collapses(fake_nlp):
    assert SpacySubjectStripper(fake_nlp).strip("a  kitten   in the snow", "") == "a kitten in the snow"


def test_spacy_through_public_api(spacy, fake_nlp, monkeypatch):
    """strip_subject_from_prompt / pf_prompt with stripper="spacy" use the cache."""
    monkeypatch.setitem(stripping._PIPELINES, ("en_core_web_sm", id(spacy)), fake_nlp)
    prompt = "a fluffy little kitten chasing a butterfly"
    assert strip_subject_from_prompt(prompt, "kitten", "spacy") == "chasing a butterfly"
    assert pf_prompt(prompt, "kitten", "spacy") == (
        "chasing a butterfly",
        {"prompt_stripped": True, "stripper": "spacy", "stripper_model": "en_core_web_sm-3.8.0"},
    )
    assert pf_prompt("a cat on a sofa", "kitten", "spacy") == (
        "a cat on a sofa",
        {"prompt_stripped": False, "stripper": "spacy", "stripper_model": "en_core_web_sm-3.8.0"},
    )
    # empty name: spaCy never runs
    fake_nlp.calls.clear()
    assert strip_subject_from_prompt(" a  kitten", "  ", "spacy") == "a kitten"
    assert fake_nlp.calls == []
    # another model name goes to its own cache entry
    other = FakeNLP(spacy, meta={"lang": "en", "name": "core_web_md", "version": "3.8.0"})
    monkeypatch.setitem(stripping._PIPELINES, ("en_core_web_md", id(spacy)), other)
    assert strip_subject_from_prompt(prompt, "kitten", "spacy", spacy_model="en_core_web_md") == "chasing a butterfly"
    assert other.calls == [prompt, "kitten"]
    assert SpacySubjectStripper.load("en_core_web_md").model_name == "en_core_web_md-3.8.0"


def test_spacy_model_name(spacy, fake_nlp):
    assert SpacySubjectStripper(fake_nlp).model_name == "en_core_web_sm-3.8.0"
    assert SpacySubjectStripper(spacy.blank("en")).model_name.startswith("en_pipeline-")
    fake_nlp.meta = {"lang": "en"}
    assert SpacySubjectStripper(fake_nlp).model_name == "en_?-?"


# --------------------------------------------------------------------------
# spaCy: load(), errors, warning, thread safety
# --------------------------------------------------------------------------


@pytest.fixture
def empty_cache(monkeypatch):
    monkeypatch.setattr(stripping, "_PIPELINES", {})
    return stripping._PIPELINES


def test_load_missing_spacy_raises_import_error(empty_cache, monkeypatch):
    monkeypatch.setitem(sys.modules, "spacy", None)  # makes `import spacy` fail
    with pytest.raises(ImportError, match=r"pip install 'spacy<4,>=3.8' \(masc-engine's \[spacy\] extra") as e:
        SpacySubjectStripper.load()
    assert "python -m spacy download en_core_web_sm" in str(e.value)
    assert "\n" not in str(e.value)
    with pytest.raises(ImportError):
        strip_subject_from_prompt("a kitten", "kitten", "spacy")
    with pytest.raises(ImportError):
        pf_prompt("a kitten", "kitten", "spacy")
    assert empty_cache == {}


def test_load_missing_model_raises_os_error(spacy, empty_cache):
    name = "masc_engine_no_such_model_xyz"
    with pytest.raises(OSError, match=f"python -m spacy download {name}") as e:
        SpacySubjectStripper.load(name)
    assert isinstance(e.value.__cause__, OSError)
    assert empty_cache == {}


def test_load_warns_on_other_model_version(spacy, empty_cache, monkeypatch):
    loaded = []

    def fake_load(model, disable=()):
        loaded.append((model, list(disable)))
        version = "3.7.1" if model == "en_core_web_sm" else "0.1.0"
        return FakeNLP(spacy, meta={"lang": "en", "name": model[3:], "version": version})

    monkeypatch.setattr(spacy, "load", fake_load)
    with pytest.warns(UserWarning, match=r"Loaded en_core_web_sm 3\.7\.1; .* tested with 3\.8\.0") as rec:
        s = SpacySubjectStripper.load()
    assert rec[0].filename == __file__  # stacklevel points at load()'s caller
    assert loaded == [("en_core_web_sm", ["ner"])]
    assert s.model_name == "en_core_web_sm-3.7.1"
    # cached: no second load, no second warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert SpacySubjectStripper.load().nlp is s.nlp
        # other model names never warn about their version
        SpacySubjectStripper.load("en_custom")
    assert loaded == [("en_core_web_sm", ["ner"]), ("en_custom", ["ner"])]


def test_load_reference_version_does_not_warn(spacy, empty_cache, monkeypatch):
    monkeypatch.setattr(spacy, "load", lambda model, disable=(): FakeNLP(spacy))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert SpacySubjectStripper.load().model_name == "en_core_web_sm-3.8.0"


def test_load_is_thread_safe(spacy, empty_cache, monkeypatch):
    n_loads = 0
    counter_lock = threading.Lock()

    def slow_load(model, disable=()):
        nonlocal n_loads
        with counter_lock:
            n_loads += 1
        time.sleep(0.05)
        return FakeNLP(spacy)

    monkeypatch.setattr(spacy, "load", slow_load)
    barrier = threading.Barrier(8)
    results = []

    def worker():
        barrier.wait()
        s = SpacySubjectStripper.load()
        results.append((s.nlp, s.strip("a fluffy little kitten chasing a butterfly", "kitten")))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert n_loads == 1
    assert len(results) == 8
    assert len({id(nlp) for nlp, _ in results}) == 1
    assert {text for _, text in results} == {"chasing a butterfly"}


# --------------------------------------------------------------------------
# spaCy oracle: same pipeline into ours and masc-metric's
# --------------------------------------------------------------------------


@pytest.mark.oracle
def test_oracle_spacy_same_pipeline(oracle, fake_nlp):
    ours = SpacySubjectStripper(fake_nlp)
    ref = oracle.text.SpacySubjectStripper(fake_nlp)
    assert ours.model_name == ref.model_name
    for prompt, object_name, _ in SPACY_CASES:
        doc = fake_nlp(prompt)
        spans = ours.find_mentions(doc, object_name)
        assert spans == ref.find_mentions(doc, object_name), (prompt, object_name)
        assert ours._removal_indices(doc, spans) == ref._removal_indices(doc, spans), prompt
        assert ours.strip(prompt, object_name) == ref.strip(prompt, object_name), prompt


@pytest.mark.oracle
def test_oracle_spacy_label_parses(oracle, spacy):
    """The per-label parses above, through ours and the oracle's stripper."""
    labels = PRE_MODIFIER_LABELS + ["advmod", "punct", "dep", "nsubj", "acl", "conj"]
    for label in labels:
        for prompt, name, toks in [
            (
                "tabby kitten sleeping",
                "kitten",
                [
                    _tok("tabby", "tabby", "ADJ", label, 1),
                    _tok("kitten", "kitten", "NOUN", "ROOT", 1),
                    _tok("sleeping", "sleep", "VERB", "acl", 1),
                ],
            ),
            (
                "a dolphin swimming",
                "dolphin",
                [
                    _tok("a", "a", "DET", "det", 2),
                    _tok("dolphin", "dolphin", "NOUN", label, 2),
                    _tok("swimming", "swimming", "NOUN", "ROOT", 2),
                ],
            ),
            (
                "a dolphin rider",
                "dolphin",
                [
                    _tok("a", "a", "DET", "det", 2),
                    _tok("dolphin", "dolphin", "NOUN", label, 2),
                    _tok("rider", "rider", "NOUN", "ROOT", 2),
                ],
            ),
        ]:
            nlp = FakeNLP(spacy, {name: PARSES[name], prompt: toks})
            assert SpacySubjectStripper(nlp).strip(prompt, name) == oracle.text.SpacySubjectStripper(nlp).strip(
                prompt, name
            ), (label, prompt)


@pytest.mark.oracle
def test_oracle_spacy_public_api(oracle, spacy, fake_nlp, monkeypatch):
    monkeypatch.setitem(stripping._PIPELINES, ("en_core_web_sm", id(spacy)), fake_nlp)
    monkeypatch.setitem(oracle.text._PIPELINES, "en_core_web_sm", fake_nlp)
    ref_model = oracle.text.SpacySubjectStripper.load().model_name
    names = ["", "  "]
    for prompt, object_name, _ in SPACY_CASES:
        for name in [object_name, *names]:
            assert strip_subject_from_prompt(prompt, name, "spacy") == oracle.text.strip_subject_from_prompt(
                prompt, name, "spacy"
            )
            assert pf_prompt(prompt, name, "spacy") == _oracle_pf_prompt(oracle, prompt, name, "spacy", ref_model)
        assert pf_prompt(prompt, None, "spacy") == _oracle_pf_prompt(oracle, prompt, None, "spacy", ref_model)


@pytest.mark.oracle
def test_oracle_spacy_load_errors_match(oracle, spacy, empty_cache, monkeypatch):
    monkeypatch.setattr(oracle.text, "_PIPELINES", {})
    name = "masc_engine_no_such_model_xyz"
    with pytest.raises(OSError) as ours:
        SpacySubjectStripper.load(name)
    with pytest.raises(OSError) as ref:
        oracle.text.SpacySubjectStripper.load(name)
    assert str(ours.value) == str(ref.value)


# --------------------------------------------------------------------------
# spaCy with the real en_core_web_sm (skips where it is not installed)
# --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def en_core_web_sm(spacy):
    if not spacy.util.is_package("en_core_web_sm"):
        pytest.skip("en_core_web_sm is not installed (not on PyPI: python -m spacy download en_core_web_sm)")
    return "en_core_web_sm"


def test_real_model_docstring_examples(en_core_web_sm):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # version warning, checked elsewhere
        s = SpacySubjectStripper.load(en_core_web_sm)
    assert s.strip("a fluffy little kitten chasing a butterfly", "kitten") == "chasing a butterfly"
    assert s.strip("the dog's ball on the grass", "dog") == "ball on the grass"
    assert s.strip("a kitten and a puppy", "kitten") == "and a puppy"
    assert s.strip("a cat on a sofa", "kitten") == "a cat on a sofa"


@pytest.mark.oracle
def test_oracle_real_model_dreambooth(oracle, en_core_web_sm, dreambooth_rows):
    rows = dreambooth_rows
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = SpacySubjectStripper.load(en_core_web_sm)
        ref = oracle.text.SpacySubjectStripper.load(en_core_web_sm)
    assert ours.model_name == ref.model_name
    for prompt, object_name in rows + [(p, o) for p, o, _ in SPACY_CASES]:
        assert ours.strip(prompt, object_name) == ref.strip(prompt, object_name), (prompt, object_name)
        assert pf_prompt(prompt, object_name, "spacy") == _oracle_pf_prompt(
            oracle, prompt, object_name, "spacy", ref.model_name
        )


def test_version_warning_follows_the_spacy_module(empty_cache, monkeypatch):
    """masc-metric's own test_other_model_version_warns, as its stand-in runs it: spaCy is
    replaced by a stand-in reporting another en_core_web_sm version after a pipeline was already
    cached. The cached pipeline belongs to the old module, so the new one is loaded and warns
    (through a shim that copies the names, resetting the shim's cache never reaches ours)."""
    import types

    def stand_in(version):
        def load(model, disable=()):
            return types.SimpleNamespace(meta={"lang": "en", "name": "core_web_sm", "version": version})

        monkeypatch.setitem(sys.modules, "spacy", types.SimpleNamespace(load=load))

    stand_in(stripping.REFERENCE_SPACY_MODEL_VERSION)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        first = SpacySubjectStripper.load()
        assert SpacySubjectStripper.load().nlp is first.nlp  # cached for the same spaCy
    stand_in("3.7.1")
    with pytest.warns(UserWarning, match=r"en_core_web_sm 3\.7\.1.*tested with 3\.8\.0"):
        assert SpacySubjectStripper.load().model_name == "en_core_web_sm-3.7.1"
