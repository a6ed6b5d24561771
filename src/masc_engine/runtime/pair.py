"""One scoring input and its result: what :class:`~masc_engine.runtime.scorer.Scorer` takes and
gives (``Pair``, ``EncodedPair``, ``ImageEncoding``, ``MaSCResult``), and the API boundary's check
of a pair's arguments (:func:`check_pair_arguments`). runtime/scorer.py exports every name here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from PIL import Image

from ..errors import InputError
from .masks import MaskPolicy
from .text import PreparedPrompt

if TYPE_CHECKING:
    from .segmenter import Segmenter


@dataclass
class MaSCResult:
    """Result of one scoring call (same fields as masc-metric 0.3.0 ``MaSCResult``).

    Attributes:
        cp: Concept Preservation in ``[-1, 1]``; NaN when the reference mask keeps no patch.
        pf: Prompt Following in ``[-1, 1]``; NaN when the output mask leaves no background patch.
        extras: the reference's diagnostics (``prompt_text``, ``prompt_stripped``, ``stripper``,
            ``stripper_model``, ``cp_n_ref_fg``, ``cp_n_ref_total``, ``cp_fg_frac_ref``,
            ``pf_n_fg``, ``pf_n_total``, ``pf_n_bg_pooled``) plus ``prompt_truncated``,
            ``prompt_n_tokens``, ``ref_grid``, ``out_grid``.
    """

    cp: float
    pf: float
    extras: dict[str, Any] = field(default_factory=dict)
    #: Per-patch arrays behind the scores, filled when asked for (``with_arrays=True``):
    #: ``cp_best [Hp_r*Wp_r] float32`` (each reference patch's best cosine), ``pf_attention
    #: [Hp_o*Wp_o] float32`` (pooling-head attention with the foreground hidden), ``pf_hidden``.
    arrays: dict[str, Any] = field(default_factory=dict, repr=False)
    #: The masks the scorer's segmenter computed for this pair (``ref_mask`` / ``out_mask``:
    #: ``[H, W] uint8`` 0/255), for the masks that were not given.
    masks: dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class ImageEncoding:
    """One image through the vision tower.

    Attributes:
        tokens: ``[Hp * Wp, D] float32`` patch tokens of the real patches, row-major: a numpy
            array, or an array of the scorer's token device when it is ``device_resident``.
        grid: the patch grid ``(Hp, Wp)``.
    """

    tokens: np.ndarray
    grid: tuple[int, int]


@dataclass
class Pair:
    """One scoring input (the arguments of :meth:`Scorer.score`); a mask may be None when the
    scorer has a segmenter (it is computed from ``object_name``)."""

    ref_image: Image.Image
    ref_mask: np.ndarray | None
    out_image: Image.Image
    out_mask: np.ndarray | None
    prompt: str
    object_name: str | None = None


def check_pair_arguments(
    p: Pair, where: str = "", policy: MaskPolicy = MaskPolicy(), segmenter: Segmenter | None = None
) -> None:
    """Check one pair's arguments before any inference (the API boundary).

    Args:
        p: the pair.
        where: prefix naming the pair in messages (``"pairs[3]."``; ``""`` for :meth:`Scorer.score`).
        policy: the mask size rule (runtime/masks.py :class:`MaskPolicy`; the scorer's
            ``mask_size_policy``).
        segmenter: the scorer's :class:`~masc_engine.runtime.segmenter.Segmenter`: a mask may then
            be None (computed from ``object_name``).

    Raises:
        TypeError: ``ref_image`` / ``out_image`` not a PIL image, a mask not a numpy array of
            numbers or booleans (or None without a segmenter), ``prompt`` not a str,
            ``object_name`` neither a str nor None (the message names the argument).
        InputError: (a ``ValueError``) a mask that is not 2-D (``bad_mask``) or whose size the
            policy refuses (``mask_size_mismatch``, ``mask_orientation_mismatch``); a mask left to
            the segmenter without a subject name (``no_mask_source``) or with one over its prompt
            budget (``prompt_too_long``).
    """
    for name in ("ref_image", "out_image"):
        im = getattr(p, name)
        if not isinstance(im, Image.Image):
            raise TypeError(
                f"{where}{name} must be a PIL.Image.Image (open files with PIL.Image.open), got {type(im).__name__}"
            )
    for name, image_name, what in (("ref_mask", "ref_image", "reference"), ("out_mask", "out_image", "output")):
        m = getattr(p, name)
        if m is None and segmenter is not None:
            _check_subject(segmenter, p.object_name, f"{where}{name}")
            continue
        if not isinstance(m, np.ndarray) or m.dtype.kind not in "biuf":
            got = type(m).__name__ if not isinstance(m, np.ndarray) else f"an array of {m.dtype}"
            raise TypeError(
                f"{where}{name} must be a numpy array [H, W] (uint8 0..255, float 0..1 or bool), "
                f"got {got}" + (" (or make the scorer with segmenter=... to compute masks)" if m is None else "")
            )
        if m.ndim != 2:
            raise InputError("bad_mask", f"{where}{name} must be 2-D [H, W], got shape {m.shape}")
        im = getattr(p, image_name)
        policy.check((im.height, im.width), m.shape, what)
    if not isinstance(p.prompt, str):
        raise TypeError(f"{where}prompt must be a str, got {type(p.prompt).__name__}")
    if p.object_name is not None and not isinstance(p.object_name, str):
        raise TypeError(f"{where}object_name must be a str or None, got {type(p.object_name).__name__}")


def _check_subject(segmenter: Segmenter, object_name: object, name: str) -> None:
    """A mask left to the segmenter needs a subject name that makes a valid prompt.

    Raises:
        InputError: ``no_mask_source`` or ``prompt_too_long`` (naming the mask argument).
    """
    if not isinstance(object_name, str) or not object_name.strip():
        raise InputError("no_mask_source", f"{name} is None and there is no object_name to prompt the segmenter with")
    try:
        segmenter.prompt(object_name)
    except InputError as e:
        raise InputError(e.reason, f"{name}: {e.detail}") from None


@dataclass
class EncodedPair:
    """A pair ready for the heads: encodings plus mask weights on each patch grid
    (``ref_weights [Hp_r * Wp_r] float32``, ``out_weights [Hp_o * Wp_o] float32``);
    ``prepared``: the PF prompt already stripped and tokenized (:meth:`Scorer.prepare_prompt`),
    else ``prompt`` and ``object_name`` are stripped when scored."""

    ref_enc: ImageEncoding
    ref_weights: np.ndarray
    out_enc: ImageEncoding
    out_weights: np.ndarray
    prompt: str
    object_name: str | None = None
    prepared: PreparedPrompt | None = None
