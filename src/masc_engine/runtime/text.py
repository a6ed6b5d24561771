"""Torch-free text pipeline: the checkpoint's tokenizer with the reference's padding/truncation.

The bundle stores the tokenizer exactly as transformers loaded it at export time
(``tokenizer.json``: normalizer incl. SigLIP2's lowercasing, pre-tokenizer, BPE model, special-token
post-processor). The manifest's ``text`` section gives what transformers applies on top: pad to
``max_length`` (64 for SigLIP2) on ``padding_side`` with ``pad_token_id``, truncate on
``truncation_side``. The text tower gets no attention mask, as in masc-metric 0.3.0.

A prompt longer than ``max_length`` tokens is truncated and flagged (``truncated=True``). The
reference truncates too for SigLIP2 processors (``Siglip2Processor`` defaults ``truncation=True``);
fixed-size SigLIP checkpoints' ``SiglipProcessor`` does not, and the reference then fails inside
the text tower: we score the truncated prompt instead and say so.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TextSettings:
    """``manifest.json["text"]``."""

    tokenizer_file: str
    max_length: int
    padding_side: str
    truncation_side: str
    pad_token_id: int
    pad_token: str

    @classmethod
    def from_manifest(cls, d: dict) -> "TextSettings":
        return cls(d["tokenizer_file"], int(d["max_length"]), d["padding_side"], d["truncation_side"],
                   int(d["pad_token_id"]), d["pad_token"])


@dataclass(frozen=True)
class EncodedPrompt:
    """``input_ids [max_length] int64``; ``n_tokens`` before truncation; ``truncated`` flag."""

    input_ids: np.ndarray
    n_tokens: int
    truncated: bool


class PromptTokenizer:
    """Tokenize prompts for the text tower. Thread-safe: configured once, then read-only."""

    def __init__(self, tokenizer_path: str, settings: TextSettings):
        from tokenizers import Tokenizer

        self.settings = settings
        tok = Tokenizer.from_file(str(tokenizer_path))
        tok.no_padding()
        tok.no_truncation()
        self._full = tok  # for the untruncated length
        tok2 = Tokenizer.from_file(str(tokenizer_path))
        tok2.enable_truncation(settings.max_length, direction=settings.truncation_side)
        tok2.enable_padding(direction=settings.padding_side, pad_id=settings.pad_token_id,
                            pad_token=settings.pad_token, length=settings.max_length)
        self._tok = tok2

    def encode(self, texts: list[str]) -> list[EncodedPrompt]:
        """Encode prompts to ``max_length`` ids each, with truncation flags."""
        full = self._full.encode_batch(list(texts))
        padded = self._tok.encode_batch(list(texts))
        out = []
        for f, p in zip(full, padded):
            ids = np.asarray(p.ids, dtype=np.int64)
            n = len(f.ids)
            out.append(EncodedPrompt(ids, n, n > self.settings.max_length))
        return out
