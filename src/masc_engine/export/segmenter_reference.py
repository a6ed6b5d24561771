"""The mask recipe written with transformers, PyTorch and Pillow: the reference the torch-free
:class:`~masc_engine.runtime.segmenter.Segmenter` is compared with (tests/test_segmenter.py,
bench/segmenter.py).

Each step uses the library a CLIPSeg user would: ``CLIPSegProcessor`` for the image (resize,
rescale, normalize) and the prompt (tokenizer, ``padding=True``), ``CLIPSegForImageSegmentation``
for the logits, ``torch.sigmoid`` for the probability, Pillow's bilinear resize of the float
probability map to the image size (the recipe's definition of that step), and a float32 ``>``
against the threshold in PyTorch. Only the prompt text comes from the recipe object
(:meth:`~masc_engine.runtime.segmenter.MaskRecipe.prompt`: a string template).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from PIL import Image

from ..runtime.segmenter import MaskRecipe


def reference_logits(
    model, processor, images: Sequence[Image.Image], subject_names: Sequence[str], recipe: MaskRecipe
) -> np.ndarray:
    """``[n, S, S] float32`` logits of ``CLIPSegForImageSegmentation`` for the i-th image prompted
    by the i-th subject name (one forward pass for all; images converted to RGB)."""
    import torch

    prompts = [recipe.prompt(n) for n in subject_names]
    inputs = processor(text=prompts, images=[im.convert("RGB") for im in images], padding=True, return_tensors="pt")
    with torch.no_grad():
        return model(**inputs).logits.reshape(len(prompts), *inputs["pixel_values"].shape[-2:]).numpy()


def reference_probabilities(
    model, processor, images: Sequence[Image.Image], subject_names: Sequence[str], recipe: MaskRecipe
) -> list[np.ndarray]:
    """``[H, W] float32`` probability maps: ``torch.sigmoid`` of the logits, resized to each
    image's size by Pillow (bilinear, on a mode ``F`` image)."""
    import torch

    logits = reference_logits(model, processor, images, subject_names, recipe)
    out = []
    for lg, im in zip(logits, images):
        prob = torch.sigmoid(torch.from_numpy(lg)).numpy().astype(np.float32)
        pil = Image.frombytes("F", (prob.shape[1], prob.shape[0]), prob.tobytes())
        if pil.size != im.size:
            pil = pil.resize(im.size, Image.Resampling.BILINEAR)
        out.append(np.array(pil, dtype=np.float32))
    return out


def reference_threshold(probabilities: Sequence[np.ndarray], recipe: MaskRecipe) -> list[np.ndarray]:
    """``[H, W] uint8`` masks from probability maps: 255 where ``> threshold`` in float32 (PyTorch)."""
    import torch

    thr = torch.tensor(recipe.threshold, dtype=torch.float32)
    return [(torch.from_numpy(np.array(p, np.float32)) > thr).numpy().astype(np.uint8) * 255 for p in probabilities]


def reference_masks(
    model, processor, images: Sequence[Image.Image], subject_names: Sequence[str], recipe: MaskRecipe
) -> list[np.ndarray]:
    """``[H, W] uint8`` masks of the whole reference recipe (probabilities, then the threshold)."""
    return reference_threshold(reference_probabilities(model, processor, images, subject_names, recipe), recipe)
