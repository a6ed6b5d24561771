"""The segmenter bundle's graphs: torch modules over transformers' CLIPSegForImageSegmentation and
a declarative spec for each (export/graphs.py :class:`~.graphs.GraphSpec`), as export/graphs.py
does for the scorer's; export/segmenter.py exports and validates them.

- ``vision``: ``pixel_values [B, 3, S, S] f32`` -> ``activations [B, K, T, D] f32``;
- ``text``: ``input_ids [B, L] i64`` -> ``conditional_embeddings [B, P] f32``;
- ``decoder``: ``activations``, ``conditional_embeddings`` -> ``logits [B, S, S] f32``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from .graphs import GraphSpec, TensorSpec

if TYPE_CHECKING:
    from transformers import CLIPSegForImageSegmentation


class CLIPSegVisionSide(nn.Module):
    """``pixel_values [B, 3, S, S]`` -> ``activations [B, K, T, D]``: CLIPSegVisionEmbeddings
    (interpolated position embeddings as a constant), ``pre_layrnorm``, encoder layers up to the
    last of ``extract_layers``, stacking the outputs of those layers.

    Same computation as transformers 5.24.0 ``CLIPSegForImageSegmentation.forward`` step 1
    (``hidden_states[i + 1] for i in extract_layers``).
    """

    def __init__(self, model: CLIPSegForImageSegmentation, image_size: int):
        super().__init__()
        vm = model.clip.vision_model
        self.vm = vm
        self.extract = [int(i) for i in model.extract_layers]
        emb = vm.embeddings
        tokens = 1 + (image_size // emb.patch_size) ** 2
        with torch.no_grad():
            pos = emb.interpolate_pos_encoding(torch.zeros(1, tokens, emb.embed_dim), image_size, image_size)
        self.register_buffer("position_embeddings", pos.detach().clone(), persistent=False)

    def forward(self, pixel_values):
        emb = self.vm.embeddings
        x = emb.patch_embedding(pixel_values).flatten(2).transpose(1, 2)
        cls = emb.class_embedding.expand(x.shape[0], 1, -1)
        x = torch.cat([cls, x], dim=1) + self.position_embeddings
        x = self.vm.pre_layrnorm(x)
        outs = []
        for i, layer in enumerate(self.vm.encoder.layers[: max(self.extract) + 1]):
            x = layer(x, None)
            if i in self.extract:
                outs.append(x)
        return torch.stack(outs, dim=1)


class CLIPSegTextSide(nn.Module):
    """``input_ids [B, L]`` -> ``conditional_embeddings [B, P]`` (``clip.get_text_features``)."""

    def __init__(self, model: CLIPSegForImageSegmentation):
        super().__init__()
        self.clip = model.clip

    def forward(self, input_ids):
        return self.clip.get_text_features(input_ids=input_ids).pooler_output


class CLIPSegDecoderSide(nn.Module):
    """``activations [B, K, T, D]``, ``conditional_embeddings [B, P]`` -> ``logits [B, S, S]``
    (``CLIPSegDecoder`` on the activations in ``extract_layers`` order)."""

    def __init__(self, model: CLIPSegForImageSegmentation):
        super().__init__()
        self.decoder = model.decoder
        self.k = len(model.extract_layers)

    def forward(self, activations, conditional_embeddings):
        hidden = tuple(activations[:, i] for i in range(self.k))
        return self.decoder(hidden, conditional_embeddings).logits


def graph_specs(model, image: dict, text: dict) -> list[GraphSpec]:
    """The three graphs' specs (export/graphs.py), traced at batch 2."""
    s = int(image["image_size"][0])
    d = int(model.config.vision_config.hidden_size)
    k = len(model.extract_layers)
    t = 1 + (s // int(image["patch_size"])) ** 2
    p = int(model.config.projection_dim)
    length = int(text["max_length"])
    vocab = int(model.config.text_config.vocab_size)
    g = lambda seed: torch.Generator().manual_seed(seed)  # noqa: E731
    return [
        GraphSpec(
            "vision",
            "vision.onnx",
            [TensorSpec("pixel_values", "float32", ("batch", 3, s, s))],
            [TensorSpec("activations", "float32", ("batch", k, t, d))],
            CLIPSegVisionSide(model, s).eval(),
            lambda: (torch.randn(2, 3, s, s, generator=g(0)),),
            extra={"extract_layers": [int(i) for i in model.extract_layers]},
        ),
        GraphSpec(
            "text",
            "text.onnx",
            [TensorSpec("input_ids", "int64", ("batch", length))],
            [TensorSpec("conditional_embeddings", "float32", ("batch", p))],
            CLIPSegTextSide(model).eval(),
            lambda: (torch.randint(0, vocab, (2, length), generator=g(1)),),
        ),
        GraphSpec(
            "decoder",
            "decoder.onnx",
            [
                TensorSpec("activations", "float32", ("batch", k, t, d)),
                TensorSpec("conditional_embeddings", "float32", ("batch", p)),
            ],
            [TensorSpec("logits", "float32", ("batch", s, s))],
            CLIPSegDecoderSide(model).eval(),
            lambda: (torch.randn(2, k, t, d, generator=g(2)), torch.randn(2, p, generator=g(3))),
        ),
    ]
