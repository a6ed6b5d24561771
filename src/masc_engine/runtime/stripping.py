"""Subject stripping for the PF (prompt-following) prompt, without torch.

Ported from masc-metric 0.3.0 (Apache-2.0):

- ``masc/text.py``: `STRIPPERS`, `strip_subject_from_prompt`, the regex
  stripper and `SpacySubjectStripper`, rule for rule.
- ``masc/metric.py``: `MaSC._pf_prompt`, as the function `pf_prompt`.

Differences from the original, none of which changes a stripped prompt:

- Nothing here imports torch or ``masc``; spaCy is imported lazily, only when
  the ``"spacy"`` stripper is first loaded.
- The per-process spaCy pipeline cache is guarded by a `threading.Lock`, so
  concurrent scorer threads load each pipeline exactly once.
- Install hints name this package's extra (``[spacy]``: masc_engine.extras.install_hint).

Why strip at all: the subject is invariant across the prompts of a
single-concept personalization benchmark, so keeping its name in the prompt
makes the text-image cosine partly measure subject identity rather than scene
adherence. Removing it isolates the scene signal that PF should measure.

Three strippers are available through ``strip_subject_from_prompt(...,
stripper=...)`` and ``pf_prompt``:

- ``"regex"`` (default): the stripper behind every MaSC number in the paper.
  Removes ``(a|an|the) <object>``, or the bare ``<object>`` when no article
  precedes any mention. Needs no extra dependency.
- ``"spacy"``: syntax-aware (optional extra, ``pip install
  "masc-engine[spacy]"`` plus ``python -m spacy download en_core_web_sm``).
  See `SpacySubjectStripper` for the exact rule and its known limits.
- ``"none"``: returns the prompt unchanged.
"""

from __future__ import annotations

import re
import threading
import warnings
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from spacy.language import Language
    from spacy.tokens import Doc

__all__ = [
    "STRIPPERS",
    "DEFAULT_SPACY_MODEL",
    "REFERENCE_SPACY_MODEL_VERSION",
    "SpacySubjectStripper",
    "strip_subject_from_prompt",
    "pf_prompt",
]

STRIPPERS = ("regex", "spacy", "none")
DEFAULT_SPACY_MODEL = "en_core_web_sm"
# The en_core_web_sm version masc-metric's spaCy stripper was developed and
# tested with (masc/text.py, masc-metric 0.3.0).
REFERENCE_SPACY_MODEL_VERSION = "3.8.0"

# spaCy pipelines by (model name, the spacy module that loaded it), so each loads once per process
# and a pipeline is never served once ``spacy`` itself was replaced (a reload, or a stand-in in a
# test): the version check below then runs again for the pipeline actually in use. Guarded by
# _PIPELINES_LOCK: the scorer runs in several threads.
_PIPELINES: dict[tuple[str, int], Language] = {}
_PIPELINES_LOCK = threading.Lock()


def strip_subject_from_prompt(
    prompt: str,
    object_name: str,
    stripper: str = "regex",
    *,
    spacy_model: str = DEFAULT_SPACY_MODEL,
) -> str:
    """Remove the canonical subject name from a prompt.

    Port of ``masc.text.strip_subject_from_prompt`` (masc-metric 0.3.0,
    ``masc/text.py``); same output for every input.

    Args:
        prompt: The generation prompt.
        object_name: Canonical subject name, e.g. ``"kitten"`` or ``"piggy bank"``. Leading
            and trailing whitespace is ignored; an empty or all-whitespace name
            matches nothing (the prompt comes back whitespace-collapsed). ``None``
            is not accepted (AttributeError), except with ``stripper="none"``,
            which never looks at it; `pf_prompt` handles ``None``.
        stripper: ``"regex"`` (default, the paper's stripper), ``"spacy"`` or ``"none"``.
        spacy_model: spaCy pipeline used by ``stripper="spacy"``; loaded once per process.

    Returns:
        str: The prompt without the subject, whitespace collapsed to single spaces
            and trimmed; with ``stripper="none"``, the prompt exactly as given.

    Raises:
        ValueError: If `stripper` is not one of `STRIPPERS`.
        ImportError: ``stripper="spacy"`` and spaCy is not installed (the message says how
            to install it).
        OSError: ``stripper="spacy"`` and the `spacy_model` pipeline is not installed
            (the message gives the ``python -m spacy download`` command).

    Examples:
        >>> strip_subject_from_prompt(
        ...     "A photo of a kitten chasing a butterfly in a sunny garden",
        ...     "kitten",
        ... )
        'A photo of chasing a butterfly in a sunny garden'
    """
    if stripper not in STRIPPERS:
        raise ValueError(f"Unknown stripper {stripper!r}; expected one of {STRIPPERS}")
    if stripper == "none":
        return prompt
    if not object_name.strip():
        return _collapse_whitespace(prompt)
    if stripper == "regex":
        return _strip_regex(prompt, object_name)
    return SpacySubjectStripper.load(spacy_model).strip(prompt, object_name)


def pf_prompt(prompt: str, object_name: Optional[str], stripper: str) -> tuple[str, dict[str, Any]]:
    """The text the PF head encodes, and how it was obtained.

    Port of ``masc.metric.MaSC._pf_prompt`` (masc-metric 0.3.0,
    ``masc/metric.py``), with the stripper validation of ``MaSC.__init__``.

    Args:
        prompt: The generation prompt.
        object_name: Canonical subject name. ``None``, ``""`` or an all-whitespace name
            means "do not strip": the prompt comes back exactly as given (not even
            whitespace-collapsed) and ``extras["stripper"]`` is ``None``.
        stripper: ``"regex"``, ``"spacy"`` or ``"none"``; see
            `strip_subject_from_prompt`. ``"spacy"`` always uses the
            ``en_core_web_sm`` pipeline, as ``MaSC`` does.

    Returns:
        tuple[str, dict]: ``(text, extras)``. `text` is the prompt to encode. `extras` has
            exactly the keys:

            - ``"prompt_stripped"`` (bool): the stripped text differs from the
              prompt other than in whitespace, i.e. the subject was found.
            - ``"stripper"`` (str or None): the stripper used; ``None`` when
              nothing was stripped because there is no object name.
            - ``"stripper_model"`` (str or None): for ``"spacy"``, the pipeline
              as ``"<lang>_<name>-<version>"`` (e.g. ``"en_core_web_sm-3.8.0"``);
              otherwise ``None``.

    Raises:
        ValueError: If `stripper` is not one of `STRIPPERS`, whatever `object_name` is
            (``MaSC`` checks it in its constructor).
        ImportError: ``stripper="spacy"``, a non-empty name, and spaCy is not installed.
        OSError: ``stripper="spacy"``, a non-empty name, and ``en_core_web_sm`` is not
            installed.
    """
    if stripper not in STRIPPERS:
        raise ValueError(f"stripper must be one of {STRIPPERS}, got {stripper!r}")
    if not (object_name and object_name.strip()):
        return prompt, {"prompt_stripped": False, "stripper": None, "stripper_model": None}
    stripper_model = SpacySubjectStripper.load().model_name if stripper == "spacy" else None
    text = strip_subject_from_prompt(prompt, object_name, stripper=stripper)
    return text, {
        # Whitespace-insensitive: True only if the subject was found.
        "prompt_stripped": text.split() != prompt.split(),
        "stripper": stripper,
        "stripper_model": stripper_model,
    }


def _collapse_whitespace(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def _strip_regex(prompt: str, object_name: str) -> str:
    """The ``"regex"`` stripper (masc-metric 0.3.0, ``masc/text.py``).

    Tries ``(a|an|the) <object>`` first, case-insensitively, and removes every
    match of it; only if it matches nowhere, removes every bare ``<object>``.
    Both patterns need a word boundary at each end. Whitespace is collapsed at
    the end. The name is `re.escape`d, so hyphens, spaces and other regex
    metacharacters are literal.
    """
    obj = re.escape(object_name.strip())
    for pattern in (rf"\b(?:a|an|the)\s+{obj}\b", rf"\b{obj}\b"):
        if re.search(pattern, prompt, flags=re.IGNORECASE):
            prompt = re.sub(pattern, "", prompt, flags=re.IGNORECASE)
            break
    return _collapse_whitespace(prompt)


# Left dependents of the subject's head noun that belong to its noun phrase.
_PRE_MODIFIER_DEPS = frozenset({"det", "predet", "poss", "nummod", "quantmod", "amod", "compound", "nmod", "nn"})
# Relations by which a mention can hang off a later word as a pre-modifier.
_MODIFIER_OF_LATER_DEPS = frozenset({"amod", "compound", "nmod", "nn"})
_SPACE_BEFORE_PUNCT = re.compile(r"\s+([,.;:!?])")
_LEADING_PUNCT = re.compile(r"^[\s,;:]+")


class SpacySubjectStripper:
    """Syntax-aware subject stripper.

    Port of ``masc.text.SpacySubjectStripper`` (masc-metric 0.3.0,
    ``masc/text.py``): same rule, same known limits, same output for the same
    pipeline.

    Rule, per prompt:

    1. Mentions. Parse prompt and object name with the same spaCy pipeline.
       A mention is a token span whose lower-cased lemmas equal the object
       name's lemmas, or whose lower-cased words equal the name's words, so
       inflected forms match ("kittens", "Kitten", "cherry blossoms").
       If the name has several words and no full mention exists, a single
       NOUN/PROPN token whose lemma equals the lemma of the name's syntactic
       head also counts ("the bouquet" for "bouquet of flowers"). Every
       mention in the prompt is handled, not only the first.
    2. Noun phrase. For each mention, take its head token and remove the
       mention together with the head's left dependents of the noun phrase
       (determiner, possessive, numeral, adjective, compound, including
       their own modifiers): "a fluffy little kitten" is removed whole. If
       the mention is itself a possessor ("the dog's ball"), its possessive
       marker goes too, leaving "ball". If the parser reads the mention as a
       modifier of a later word (the frequent mis-parse of "a dolphin
       swimming" as the compound noun "dolphin swimming"), the determiner and
       adjectives before the mention are removed with it, unless the later
       word directly follows and is a noun in its own right that does not
       end in "-ing" ("a motorcycle rider" becomes "a rider").
    3. Everything else is kept, including right-hand attachments that
       carry scene content: prepositional phrases ("on a beach"),
       participial and relative clauses ("chasing a butterfly"), and
       relations to other objects ("next to a cat").

    Known limits (documented, not handled):

    - Pronouns that refer to the subject ("its", "her", "they") are kept.
      The pipeline has no coreference component, so the stripper does not
      resolve them.
    - Coordination keeps the conjunction: "a kitten and a puppy" becomes
      "and a puppy".
    - A mention that uses neither the name nor its head noun (a synonym,
      "the feline" for "kitten", or "a corgi" for "corgi dog") is not
      found; the prompt is returned unchanged, as with the regex stripper.
    - Style references (DreamBench++ ``style_*``) have no object to strip;
      "in the style of <name>" loses the name and keeps the scaffold. MaSC
      excludes style prompts from PF.
    - Parses come from a statistical model; a mis-parse can attach a
      modifier to the wrong head. Results are deterministic for a fixed
      spaCy and model version; loading an en_core_web_sm other than
      `REFERENCE_SPACY_MODEL_VERSION` warns.

    Args:
        nlp: A pipeline with a tagger/lemmatizer and a dependency parser (or any
            callable returning a parsed `spacy.tokens.Doc`, with a ``meta`` dict).
            Use `load` to get a cached ``en_core_web_sm`` one.
    """

    def __init__(self, nlp: Language) -> None:
        self.nlp = nlp

    @classmethod
    def load(cls, model: str = DEFAULT_SPACY_MODEL) -> SpacySubjectStripper:
        """A stripper on the spaCy pipeline `model`, loaded once per process.

        Args:
            model: spaCy pipeline package name, loaded with ``spacy.load(model,
                disable=["ner"])``.

        Returns:
            SpacySubjectStripper: A stripper sharing the process-wide cached pipeline. Thread-safe:
                concurrent first calls load the pipeline once.

        Raises:
            MissingDependencyError: spaCy is not installed (an ImportError; the message gives
                the pip command).
            MissingModelError: The `model` pipeline is not installed (an OSError; the message
                gives the ``python -m spacy download`` command).

        Warns:
            UserWarning: `model` is ``en_core_web_sm`` and its version is not
                `REFERENCE_SPACY_MODEL_VERSION`: stripped prompts can differ from
                the paper's.
        """
        from ..errors import MissingDependencyError, MissingModelError
        from ..extras import install_hint

        with _PIPELINES_LOCK:
            try:
                import spacy
            except ImportError as e:
                raise MissingDependencyError(
                    f"the spaCy stripper needs spaCy, which is not installed: {install_hint('spacy')}, "
                    f"then: python -m spacy download {model}"
                ) from e
            key = (model, id(spacy))  # a re-imported spaCy (tests' fakes) gets its own pipeline
            nlp = _PIPELINES.get(key)
            if nlp is None:
                try:
                    nlp = spacy.load(model, disable=["ner"])
                except OSError as e:
                    # The reference's message, word for word (tests/test_stripping.py); it names
                    # the command, and the CLI prints it as one line.
                    raise MissingModelError(
                        f"spaCy model {model!r} is not installed: python -m spacy download {model}"
                    ) from e
                version = nlp.meta.get("version")
                if model == DEFAULT_SPACY_MODEL and version != REFERENCE_SPACY_MODEL_VERSION:
                    warnings.warn(
                        f"Loaded {model} {version}; the spaCy stripper was tested with "
                        f"{REFERENCE_SPACY_MODEL_VERSION}, so stripped prompts can differ "
                        "from the paper's.",
                        stacklevel=2,
                    )
                _PIPELINES[key] = nlp
        return cls(nlp)

    @property
    def model_name(self) -> str:
        """The pipeline as ``"<lang>_<name>-<version>"``, e.g.
        ``"en_core_web_sm-3.8.0"``; ``"?"`` for a missing meta field."""
        meta = self.nlp.meta
        return f"{meta.get('lang', '?')}_{meta.get('name', '?')}-{meta.get('version', '?')}"

    def find_mentions(self, doc: Doc, object_name: str) -> list[tuple[int, int]]:
        """Token spans of the subject's mentions in `doc` (rule 1).

        Args:
            doc: The parsed prompt.
            object_name: Canonical subject name; parsed with ``self.nlp``.

        Returns:
            list[tuple[int, int]]: Non-overlapping ``[start, end)`` token spans, left to right; empty
                if the name parses to no tokens or is not found.
        """
        name = self.nlp(object_name.strip())
        n = len(name)
        if n == 0:
            return []
        name_lemmas = [t.lemma_.lower() for t in name]
        name_words = [t.lower_ for t in name]
        spans = []
        i = 0
        while i + n <= len(doc):
            window = doc[i : i + n]
            if [t.lemma_.lower() for t in window] == name_lemmas or [t.lower_ for t in window] == name_words:
                spans.append((i, i + n))
                i += n
            else:
                i += 1
        if spans or n == 1:
            return spans
        root = name[:].root
        root_lemma = root.lemma_.lower()
        return [(t.i, t.i + 1) for t in doc if t.pos_ in ("NOUN", "PROPN") and t.lemma_.lower() == root_lemma]

    def _removal_indices(self, doc: Doc, spans: list[tuple[int, int]]) -> set[int]:
        """Token indices to drop for `spans` (rule 2)."""
        remove: set[int] = set()
        for start, end in spans:
            span = doc[start:end]
            head = span.root
            left = start
            right = max(end, head.i + 1)
            for child in head.lefts:
                if child.dep_ in _PRE_MODIFIER_DEPS:
                    left = min(left, child.left_edge.i)
            # A mention parsed as a modifier of a later word ("a dolphin
            # swimming" read as the compound noun "dolphin swimming") leaves its
            # determiner and adjectives attached to that word. They belong to
            # the mention, unless the later word follows directly and is a noun
            # in its own right ("a motorcycle rider" keeps "a").
            outer = head.head
            own_noun = outer.i == right and outer.pos_ in ("NOUN", "PROPN") and not outer.lower_.endswith("ing")
            node = head
            while not own_noun and node.dep_ in _MODIFIER_OF_LATER_DEPS and node.head.i > node.i:
                node = node.head
                for child in node.lefts:
                    if child.dep_ in _PRE_MODIFIER_DEPS and child.right_edge.i < start:
                        left = min(left, child.left_edge.i)
            # The noun phrase's left part is contiguous: remove the whole range,
            # including commas between stacked adjectives ("a small, fluffy kitten").
            remove.update(range(left, right))
            if head.dep_ == "poss":
                remove.update(c.i for c in head.rights if c.dep_ == "case")
        return remove

    def strip(self, prompt: str, object_name: str) -> str:
        """`prompt` without the mentions of `object_name` and their
        noun-phrase pre-modifiers (rules 1-3).

        Args:
            prompt: The generation prompt.
            object_name: Canonical subject name (non-empty after stripping whitespace for a
                meaningful result).

        Returns:
            str: The kept tokens with their original spacing, whitespace collapsed,
                no space before ``, . ; : ! ?``, and no leading ``, ; :``. With no
                mention, the prompt whitespace-collapsed.
        """
        doc = self.nlp(prompt)
        spans = self.find_mentions(doc, object_name)
        if not spans:
            return _collapse_whitespace(prompt)
        remove = self._removal_indices(doc, spans)
        kept = "".join(t.text_with_ws for t in doc if t.i not in remove)
        kept = re.sub(r"\s+", " ", kept)
        kept = _SPACE_BEFORE_PUNCT.sub(r"\1", kept).strip()
        return _LEADING_PUNCT.sub("", kept)
