"""The embedder bundle's graphs (export/embedders.py): torch modules and their specs.

- ``image``: ``pixel_values [B, 3, 224, 224] f32`` -> ``image_embeds [B, D] f32`` (not normalised).
- ``text`` (CLIP only): ``input_ids [B, S] i64`` (``S`` dynamic, at most the 77-token context) ->
  ``text_embeds [B, P] f32`` (not normalised).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from .graphs import GraphSpec, TensorSpec

if TYPE_CHECKING:
    from transformers import Dinov2Model

#: The graphs' fixed input side, pixels (every recipe crops to 224 x 224).
INPUT_SIZE = 224


class ClipImage(nn.Module):
    """``visual_projection(post_layernorm(CLS))``: transformers ``CLIPModel.get_image_features``."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.vm, self.proj = model.vision_model, model.visual_projection

    def forward(self, pixel_values):
        return self.proj(self.vm(pixel_values=pixel_values).pooler_output)


class ClipText(nn.Module):
    """``text_projection`` of the end-of-text token's final state (``get_text_features``), no mask."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.tm, self.proj = model.text_model, model.text_projection

    def forward(self, input_ids):
        return self.proj(self.tm(input_ids=input_ids).pooler_output)


class ViTCls(nn.Module):
    """CLS of ``last_hidden_state`` (after the final LayerNorm) of a ``ViTModel`` without pooler."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.m = model

    def forward(self, pixel_values):
        return self.m(pixel_values=pixel_values).last_hidden_state[:, 0]


class Dinov2Cls(nn.Module):
    """``Dinov2Model(pixel_values).last_hidden_state[:, 0]`` at a fixed input size, with the
    position embeddings transformers interpolates for that size (bicubic ``size=``) computed once
    here and stored as a constant."""

    def __init__(self, model: Dinov2Model, size: int = INPUT_SIZE):
        super().__init__()
        self.m = model
        emb = model.embeddings
        patch = model.config.patch_size
        if not isinstance(patch, int):  # the config allows a (height, width) pair; checkpoints give one int
            raise ValueError(f"DINOv2 with a non-square patch {patch!r} is not exported")
        with torch.no_grad():
            n = (size // patch) ** 2
            dummy = torch.zeros(1, n + 1, model.config.hidden_size)
            pos = (
                emb.interpolate_pos_encoding(dummy, size, size)
                if n + 1 != emb.position_embeddings.shape[1]
                else emb.position_embeddings
            )
        self.register_buffer("position", pos.detach().clone(), persistent=False)

    def forward(self, pixel_values):
        emb = self.m.embeddings
        x = emb.patch_embeddings(pixel_values)
        x = torch.cat((emb.cls_token.expand(x.shape[0], -1, -1), x), dim=1) + self.position
        x = self.m.encoder(x).last_hidden_state
        return self.m.layernorm(x)[:, 0]


def _image_spec(module: nn.Module, dim: int) -> GraphSpec:
    def example():
        return (torch.randn(2, 3, INPUT_SIZE, INPUT_SIZE, generator=torch.Generator().manual_seed(0)),)

    return GraphSpec(
        "image",
        "image.onnx",
        [TensorSpec("pixel_values", "float32", ("batch", 3, INPUT_SIZE, INPUT_SIZE))],
        [TensorSpec("image_embeds", "float32", ("batch", dim))],
        module.eval(),
        example,
    )


def graph_specs(m, family: str, text: dict | None) -> list[GraphSpec]:
    """The graphs of ``family`` (``clip``: image and text; ``dino``, ``dinov2``: image).

    Raises:
        ValueError: ``clip`` without ``text`` settings.
    """
    if family == "dino":
        return [_image_spec(ViTCls(m), int(m.config.hidden_size))]
    if family == "dinov2":
        return [_image_spec(Dinov2Cls(m), int(m.config.hidden_size))]
    if text is None:
        raise ValueError("a clip embedder's text graph needs its text settings (the processor's)")
    p, length, vocab = int(m.config.projection_dim), int(text["max_length"]), int(m.config.text_config.vocab_size)

    def example():
        return (torch.randint(0, vocab, (2, length), generator=torch.Generator().manual_seed(1)),)

    return [
        _image_spec(ClipImage(m), p),
        GraphSpec(
            "text",
            "text.onnx",
            [TensorSpec("input_ids", "int64", ("batch", "sequence"))],
            [TensorSpec("text_embeds", "float32", ("batch", p))],
            ClipText(m).eval(),
            example,
        ),
    ]
