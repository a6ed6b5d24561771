"""The test tokenizers of the random-weight checkpoints (export/random_models.py), trained by
`tokenizers` on a fixed built-in corpus (DreamBench-style prompt templates and class nouns).

- SigLIP2 presets (:func:`_train_tokenizer`): a small byte-fallback BPE wrapped as transformers'
  ``Siglip2Tokenizer`` (Gemma-style pre-tokenization, lowercasing), so the whole text pipeline of
  the reference runs on it. Its vocabulary is small (420 entries, 261 of them special and
  byte-fallback tokens) instead of Gemma's 256k: the text tower's cost does not depend on the
  vocabulary size beyond the embedding lookup.
- CLIPSeg and CLIP presets (:func:`_train_clip_tokenizer`): a byte-level BPE in CLIP's layout and
  vocabulary order, wrapped as transformers' ``CLIPTokenizer``.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

# Built-in corpus for the test tokenizer: DreamBench-style prompt templates and class nouns.
_CORPUS = """
a photo of a {} in the jungle. a {} in the snow. a {} on the beach. a {} on a cobblestone street.
a {} on top of pink fabric. a {} on top of a wooden floor. a {} with a city in the background.
a {} with a mountain in the background. a {} with a blue house in the background. a {} on top of
a purple rug in a forest. a {} with a wheat field in the background. a {} with a tree and autumn
leaves in the background. a {} with the Eiffel Tower in the background. a {} floating on top of
water. a {} floating in an ocean of milk. a {} on top of green grass with sunflowers around it.
a {} on top of a mirror. a {} on top of the sidewalk in a crowded street. a {} on top of a dirt
road. a {} on top of a white rug. a red {}. a purple {}. a shiny {}. a wet {}. a cube shaped {}.
a {} in a chef outfit. a {} in a firefighter outfit. a {} in a police outfit. a {} wearing a red
hat. a {} wearing a santa hat. a {} wearing a rainbow scarf. a {} wearing a black top hat and a
monocle. a {} wearing pink glasses. a {} wearing a yellow shirt. a {} in a purple wizard outfit.
"""
_NOUNS = (
    "backpack boot bowl can candle cartoon cat clock dog glasses sneaker stuffed animal teapot toy "
    "vase kitten motorcycle butterfly garden"
).split()


def _train_tokenizer(save_dir: Path):
    """A byte-fallback BPE in the Siglip2Tokenizer layout, trained on `_CORPUS` (deterministic)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import Siglip2Tokenizer

    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"] + [f"<0x{i:02X}>" for i in range(256)]
    bpe = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    bpe.normalizer = normalizers.Sequence([normalizers.Lowercase(), normalizers.Replace(" ", "▁")])
    bpe.pre_tokenizer = pre_tokenizers.Split(pattern=" ", behavior="merged_with_previous")
    trainer = trainers.BpeTrainer(vocab_size=420, special_tokens=specials, show_progress=False)
    text = " ".join(_CORPUS.split())
    lines = [s.strip().format(n) for n in _NOUNS for s in text.split(".") if "{}" in s]
    bpe.train_from_iterator(lines, trainer)
    spec = json.loads(bpe.to_str())
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in spec["model"]["merges"]]
    # merges: transformers types them list[str]; it hands them to tokenizers.models.BPE, which takes (a, b) pairs
    tok = Siglip2Tokenizer(vocab=spec["model"]["vocab"], merges=merges, model_max_length=64)  # type: ignore[arg-type]
    tok.save_pretrained(save_dir)
    return tok


#: At most this many merges in the CLIP-layout test tokenizer (the 900-entry target of the trainer
#: it replaces, less the 512 byte symbols); the built-in corpus runs out first, at 279 (793
#: entries with the two special tokens; random_models.py bounds it by 1024).
CLIP_TEST_MERGES = 388


def _learn_merges(words: Counter[tuple[str, ...]], count: int) -> list[tuple[str, str]]:
    """Byte-pair merges learned on ``words`` (symbol tuples with their frequencies), at most
    ``count``: each step merges the most frequent adjacent pair, ties broken by the pair's
    strings (so the result depends on the corpus only); stops early when no pair occurs twice.
    """
    words = Counter(words)
    merges: list[tuple[str, str]] = []
    while len(merges) < count:
        pairs: Counter[tuple[str, str]] = Counter()
        for w, n in words.items():
            for pair in zip(w, w[1:]):
                pairs[pair] += n
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        if pairs[best] < 2:
            break
        merges.append(best)
        merged: Counter[tuple[str, ...]] = Counter()
        for w, n in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(w[i] + w[i + 1])
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            merged[tuple(out)] += n
        words = merged
    return merges


def _train_clip_tokenizer(save_dir: Path):
    """A byte-level BPE in CLIP's layout, trained on `_CORPUS`, wrapped as transformers'
    ``CLIPTokenizer`` (deterministic).

    As in CLIP's own vocabulary: the 256 byte symbols, then the same with the ``</w>`` end-of-word
    suffix (so no word ever maps to the unknown token), then the merges in training order, then
    ``<|startoftext|>`` and ``<|endoftext|>`` last, so ``<|endoftext|>`` has the highest id (the
    text tower of checkpoints with the legacy ``eos_token_id = 2``, as CIDAS/clipseg-rd64-refined's,
    pools at the argmax of the ids).

    The merges are learned by :func:`_learn_merges`, not by ``tokenizers``' ``BpeTrainer``: with
    an end-of-word suffix that trainer numbers the suffixed symbols in hash-map order and breaks
    ties between equally frequent pairs by those numbers, so two processes trained different
    vocabularies on the same corpus (huggingface/tokenizers#1794), and a ``random:`` CLIP or
    CLIPSeg checkpoint tokenized the same prompt differently from one build to the next.
    """
    from tokenizers import Regex, normalizers, pre_tokenizers
    from transformers import CLIPTokenizer

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    # the words the merges are learned on, split as CLIPTokenizer splits a prompt
    normalizer = normalizers.Sequence(
        [normalizers.NFC(), normalizers.Replace(Regex(r"\s+"), " "), normalizers.Lowercase()]
    )
    pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(
                Regex(r"""'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"""), behavior="removed", invert=True
            ),
            pre_tokenizers.ByteLevel(add_prefix_space=False),
        ]
    )
    text = " ".join(_CORPUS.split())
    lines = [s.strip().format(n) for n in _NOUNS for s in text.split(".") if "{}" in s]
    words: Counter[tuple[str, ...]] = Counter()
    for line in lines:
        for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(line)):
            words[tuple(word[:-1]) + (word[-1] + "</w>",)] += 1
    merges = _learn_merges(words, CLIP_TEST_MERGES)
    vocab: dict[str, int] = {}
    for sym in alphabet + [a + "</w>" for a in alphabet] + ["".join(m) for m in merges]:
        vocab.setdefault(sym, len(vocab))
    for sym in ("<|startoftext|>", "<|endoftext|>"):
        vocab[sym] = len(vocab)
    # merges: transformers types them list[str]; it hands them to tokenizers.models.BPE, which takes (a, b) pairs
    tok = CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=77)  # type: ignore[arg-type]
    tok.save_pretrained(save_dir)
    return tok
