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
from pathlib import Path
from typing import Sequence
from typing import Any

import numpy as np

from ..engine.manifest import one_line
from ..errors import BundleError, InputError


#: The manifest's ``text.pooling`` rules of a CLIP text tower (transformers'
#: ``CLIPTextTransformer``): the legacy configs (``eos_token_id == 2``, the openai checkpoints) read
#: the token with the largest id, the others the first ``eos_token_id``.
POOLING_LEGACY_ARGMAX = "argmax of input_ids (legacy eos_token_id 2)"
POOLING_FIRST_EOS = "first eos_token_id"


def clip_pooling_rule(eos_token_id: int) -> str:
    """The ``text.pooling`` rule a CLIP text config with ``eos_token_id`` follows."""
    return POOLING_LEGACY_ARGMAX if eos_token_id == 2 else POOLING_FIRST_EOS


@dataclass(frozen=True)
class TextSettings:
    """``manifest.json["text"]``."""

    tokenizer_file: str
    max_length: int
    padding_side: str
    truncation_side: str
    pad_token_id: int
    pad_token: str
    #: The text tower's vocabulary (embedding rows); None in bundles exported before it was recorded.
    vocab_size: int | None = None

    @classmethod
    def from_manifest(cls, d: dict[str, Any]) -> "TextSettings":
        """The settings of a manifest's ``text`` section."""
        vocab = d.get("vocab_size")
        return cls(
            d["tokenizer_file"],
            int(d["max_length"]),
            d["padding_side"],
            d["truncation_side"],
            int(d["pad_token_id"]),
            d["pad_token"],
            int(vocab) if vocab is not None else None,
        )


@dataclass(frozen=True)
class EncodedPrompt:
    """``input_ids [max_length] int64``; ``n_tokens`` before truncation; ``truncated`` flag."""

    input_ids: np.ndarray
    n_tokens: int
    truncated: bool


class PromptTokenizer:
    """Tokenize prompts for the text tower. Thread-safe: configured once, then read-only."""

    def __init__(self, tokenizer_path: str | Path, settings: TextSettings) -> None:
        from tokenizers import Tokenizer

        self.settings = settings
        try:
            tok = Tokenizer.from_file(str(tokenizer_path))
        except Exception as e:  # noqa: BLE001 - the tokenizers library raises a bare Exception
            raise BundleError(f"tokenizer {tokenizer_path} could not be parsed: {one_line(e)}") from None
        tok.no_padding()
        tok.no_truncation()
        top = max(tok.get_vocab(with_added_tokens=True).values(), default=-1)
        if settings.vocab_size is not None and not 0 <= top < settings.vocab_size:
            raise BundleError(
                f"tokenizer {tokenizer_path} has token id {top}, past the text tower's vocabulary "
                f"(manifest text.vocab_size {settings.vocab_size}): the tokenizer is not the model's"
            )
        self.max_token_id = top
        self._full = tok  # for the untruncated length
        tok2 = Tokenizer.from_file(str(tokenizer_path))
        tok2.enable_truncation(settings.max_length, direction=settings.truncation_side)
        tok2.enable_padding(
            direction=settings.padding_side,
            pad_id=settings.pad_token_id,
            pad_token=settings.pad_token,
            length=settings.max_length,
        )
        self._tok = tok2

    def encode(self, texts: Sequence[str]) -> list[EncodedPrompt]:
        """Encode prompts to ``max_length`` ids each, with truncation flags."""
        full = self._full.encode_batch(list(texts))
        padded = self._tok.encode_batch(list(texts))
        out = []
        for f, p in zip(full, padded):
            ids = np.asarray(p.ids, dtype=np.int64)
            n = len(f.ids)
            out.append(EncodedPrompt(ids, n, n > self.settings.max_length))
        return out


@dataclass(frozen=True)
class PreparedPrompt:
    """A PF prompt made ready ahead of scoring (e.g. in a service's decode threads, so that no
    stripping or tokenizing runs on the thread that batches inference).

    Attributes:
        text: the stripped prompt the text tower encodes.
        extras: the stripper's extras (``prompt_stripped``, ``stripper``, ``stripper_model``;
            runtime/stripping.py ``pf_prompt``).
        encoded: its token ids, :class:`EncodedPrompt`.
    """

    text: str
    extras: dict[str, Any]
    encoded: EncodedPrompt


#: Default prompt budget of masc-serve: 4 KiB of UTF-8 per prompt or object name, and 512
#: tokens per stripped prompt. The text tower reads 64 tokens (SigLIP2's context); a longer
#: prompt is truncated and flagged ``prompt_truncated`` as in masc-run, so the budget only stops
#: megabyte-sized text from costing seconds of tokenizing and stripping.
DEFAULT_MAX_PROMPT_BYTES = 4096
DEFAULT_MAX_PROMPT_TOKENS = 512


@dataclass(frozen=True)
class PromptBudget:
    """Length limits for the text fields a request carries.

    Attributes:
        max_bytes: most UTF-8 bytes of a prompt or an object name.
        max_tokens: most tokens (the bundle tokenizer's count, before truncation to the
            context) of the stripped prompt.
    """

    max_bytes: int = DEFAULT_MAX_PROMPT_BYTES
    max_tokens: int = DEFAULT_MAX_PROMPT_TOKENS

    def check_text(self, text: str | None, field: str) -> None:
        """Refuse ``text`` over ``max_bytes`` of UTF-8 (a text with more characters than that is
        refused without encoding it).

        Raises:
            InputError: reason ``prompt_too_long``, naming ``field``.
        """
        if text is None:
            return
        if len(text) > self.max_bytes:
            raise InputError(
                "prompt_too_long", f"{field}: {len(text)} characters, over the budget of {self.max_bytes} bytes"
            )
        n = len(text.encode("utf-8", "surrogatepass"))
        if n > self.max_bytes:
            raise InputError("prompt_too_long", f"{field}: {n} bytes, over the budget of {self.max_bytes} bytes")

    def check_tokens(self, prepared: PreparedPrompt, field: str) -> None:
        """Refuse a stripped prompt of more than ``max_tokens`` tokens.

        Raises:
            InputError: reason ``prompt_too_long``, naming ``field``.
        """
        n = prepared.encoded.n_tokens
        if n > self.max_tokens:
            raise InputError("prompt_too_long", f"{field}: {n} tokens, over the budget of {self.max_tokens} tokens")
