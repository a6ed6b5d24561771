"""Token ids from the bundle's tokenizer equal the reference processor's."""

from __future__ import annotations

import json

import numpy as np
import pytest

from support import checkpoint_dir, read_rows
from masc_engine.runtime.stripping import strip_subject_from_prompt
from masc_engine.runtime.text import PromptTokenizer, TextSettings

EXTRA = [
    "",
    " ",
    "A PHOTO OF A DOG",
    "a  dog\twith\nnewlines",
    "café crème brûlée — naïve",
    "一只狗在海滩上",
    "emoji 🐶🏖️",
    "a sks dog",
    "<bos> literal special tokens <eos>",
    "a " + "very " * 40 + "long prompt about a red backpack on a mountain in the snow at dusk",
    ", ".join(["a cat"] * 30),
]


def _prompts(photo_dir) -> list[str]:
    rows = read_rows(photo_dir)
    out = [r["prompt"] for r in rows]
    out += [strip_subject_from_prompt(r["prompt"], r["object_name"]) for r in rows]
    return sorted(set(out)) + EXTRA


def test_token_ids_equal_reference_processor(any_bundle, photo_dir):
    transformers = pytest.importorskip("transformers")
    bundle = any_bundle
    m = json.loads((bundle / "manifest.json").read_text())
    settings = TextSettings.from_manifest(m["text"])
    tok = PromptTokenizer(bundle / settings.tokenizer_file, settings)
    processor = transformers.AutoProcessor.from_pretrained(checkpoint_dir(bundle))
    prompts = _prompts(photo_dir)
    ours = tok.encode(prompts)
    for p, e in zip(prompts, ours, strict=True):
        assert e.input_ids.shape == (64,) and e.input_ids.dtype == np.int64
        if e.truncated and not m["text"]["reference_truncates"]:
            # SiglipProcessor does not truncate: the reference would fail in the text tower.
            continue
        ref = processor(text=[p], padding="max_length", return_tensors="np")["input_ids"][0]
        np.testing.assert_array_equal(e.input_ids, ref, err_msg=repr(p))


def test_truncation_is_flagged(naflex_bundle):
    m = json.loads((naflex_bundle / "manifest.json").read_text())
    settings = TextSettings.from_manifest(m["text"])
    tok = PromptTokenizer(naflex_bundle / settings.tokenizer_file, settings)
    short, long = tok.encode(["a dog", EXTRA[-2]])
    assert not short.truncated and short.n_tokens <= 64
    assert long.truncated and long.n_tokens > 64 and long.input_ids.shape == (64,)
    pad = settings.pad_token_id
    side = settings.padding_side
    ids = short.input_ids
    assert (ids[: 64 - short.n_tokens] == pad).all() if side == "left" else (ids[short.n_tokens :] == pad).all()
