"""The exported graphs: a torch module and a declarative spec for each.

Like optimum's ONNX configs, each graph is described once (:class:`GraphSpec`: inputs with
dtypes and dynamic axes, outputs, how to make example inputs); the exporter and the validator read
the spec, never the module's internals.

Graphs (SigLIP2 names; ``B`` batch, ``N`` patch tokens, ``D`` width, ``G`` position grid side):

- ``vision`` (NaFlex): ``pixel_values [B, N, 3*p*p] f32``, ``pixel_attention_mask [B, N] i32``,
  ``position_weights [B, N, G*G] f32`` -> ``last_hidden_state [B, N, D] f32`` (after
  ``post_layernorm``; the patch tokens MaSC uses). The antialiased position-embedding resize runs
  outside the graph (runtime/position.py) because TensorRT has no antialiased Resize.
- ``vision`` (fixed-size): ``pixel_values [B, 3, H, W] f32`` -> ``last_hidden_state [B, N, D]``.
- ``pool``: the trained ``MultiheadAttentionPoolingHead`` with a key_padding_mask:
  ``hidden [B, N, D] f32``, ``key_padding_mask [B, N] bool`` (True = hidden) ->
  ``pooled [B, D] f32``, ``attention [B, N] f32`` (probe attention averaged over heads).
- ``text``: ``input_ids [B, L] i64`` -> ``text_embeds [B, P] f32`` (the text tower's pooled
  output: last token, then ``head``; no attention mask, as in the reference).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from torch import nn

#: Additive attention mask for hidden keys. Finite (not -inf) so that a fully hidden row gives a
#: uniform softmax instead of NaN, and representable in fp16 (max 65504) for TensorRT engines.
#: exp(-30000 + logit - max) underflows to exactly 0 in float32, so rows with at least one visible
#: key equal the reference's finfo.min / -inf masking bit for bit in the softmax weights.
MASK_VALUE = -30000.0


class NaFlexVisionTower(nn.Module):
    """SigLIP2 NaFlex vision tower up to ``post_layernorm``, position resize as a matrix input."""

    def __init__(self, vision_model: nn.Module):
        super().__init__()
        self.vm = vision_model

    def forward(self, pixel_values, pixel_attention_mask, position_weights):
        emb = self.vm.embeddings
        x = emb.patch_embedding(pixel_values)
        x = x + position_weights @ emb.position_embedding.weight
        hidden = (pixel_attention_mask == 0)[:, None, None, :].to(x.dtype) * MASK_VALUE
        x = self.vm.encoder(inputs_embeds=x, attention_mask=hidden).last_hidden_state
        return self.vm.post_layernorm(x)


class FixedVisionTower(nn.Module):
    """Fixed-size SigLIP / SigLIP2 vision tower up to ``post_layernorm``."""

    def __init__(self, vision_model: nn.Module):
        super().__init__()
        self.vm = vision_model

    def forward(self, pixel_values):
        x = self.vm.embeddings(pixel_values)
        x = self.vm.encoder(inputs_embeds=x).last_hidden_state
        return self.vm.post_layernorm(x)


def _pool_attention(head: nn.Module) -> nn.MultiheadAttention:
    """The pooling head's ``attention``: a ``torch.nn.MultiheadAttention`` in SigLIP and SigLIP2.

    Raises:
        ValueError: ``head.attention`` is another module (not a SigLIP / SigLIP2 pooling head).
    """
    att = head.attention
    if not isinstance(att, nn.MultiheadAttention):
        raise ValueError(f"pooling head's attention is a {type(att).__name__}, not torch.nn.MultiheadAttention")
    return att


class MaskedPoolingHead(nn.Module):
    """``MultiheadAttentionPoolingHead.forward`` with a key_padding_mask threaded through the
    attention, written out (q/k/v projections from ``in_proj_weight``) so the graph is plain
    MatMul/Softmax and the probe's attention can be returned for attribution maps.

    Same computation as masc-metric 0.3.0 ``MaSC._pool_with_kpm``.
    """

    def __init__(self, head: nn.Module):
        super().__init__()
        self.head = head
        self.num_heads = _pool_attention(head).num_heads

    def forward(self, hidden, key_padding_mask):
        att = self.head.attention
        b, n, d = hidden.shape
        h = self.num_heads
        hd = d // h
        w_q, w_k, w_v = att.in_proj_weight.chunk(3, dim=0)
        b_q, b_k, b_v = att.in_proj_bias.chunk(3, dim=0)
        probe = self.head.probe  # [1, 1, D]
        q = (probe @ w_q.T + b_q).reshape(1, 1, h, hd).transpose(1, 2)  # [1, H, 1, hd]
        k = (hidden @ w_k.T + b_k).reshape(b, n, h, hd).transpose(1, 2)  # [B, H, N, hd]
        v = (hidden @ w_v.T + b_v).reshape(b, n, h, hd).transpose(1, 2)
        logits = (q * (hd**-0.5)) @ k.transpose(-1, -2)  # [B, H, 1, N]
        logits = logits + key_padding_mask[:, None, None, :].to(logits.dtype) * MASK_VALUE
        weights = torch.softmax(logits, dim=-1)
        out = (weights @ v).transpose(1, 2).reshape(b, 1, d)
        out = att.out_proj(out)
        out = out + self.head.mlp(self.head.layernorm(out))
        return out[:, 0], weights.mean(dim=1)[:, 0]


class TextTower(nn.Module):
    """The text tower's pooled embedding (last token -> ``head``), without an attention mask."""

    def __init__(self, text_model: nn.Module):
        super().__init__()
        self.tm = text_model

    def forward(self, input_ids):
        return self.tm(input_ids=input_ids).pooler_output


@dataclass(frozen=True)
class TensorSpec:
    """One graph input or output: name, numpy dtype name, axis names (str = dynamic) or sizes."""

    name: str
    dtype: str
    shape: tuple


@dataclass
class GraphSpec:
    """A declarative description of one exported graph."""

    name: str
    file: str
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    module: nn.Module
    example: Callable[[], tuple]  # torch tensors for tracing
    extra: dict = field(default_factory=dict)
    #: Weights in ``<file>.data`` beside the graph (the towers): ONNX Runtime maps them instead of
    #: parsing a protobuf of the model's size, onnx reads the graph without them, the exporter
    #: streams them to disk tensor by tensor, and the fused variant points at them instead of
    #: storing a second copy (export/external_data.py).
    external_data: bool = False

    def manifest_entry(self) -> dict:
        return {
            "file": self.file,
            "inputs": [{"name": t.name, "dtype": t.dtype, "shape": list(t.shape)} for t in self.inputs],
            "outputs": [{"name": t.name, "dtype": t.dtype, "shape": list(t.shape)} for t in self.outputs],
            **self.extra,
        }


def vision_spec_naflex(vision_model, patch_size: int, grid: int, trace_patches: int) -> GraphSpec:
    d = vision_model.config.hidden_size
    pp3 = 3 * patch_size * patch_size

    def example():
        g = torch.Generator().manual_seed(0)
        pv = torch.randn(2, trace_patches, pp3, generator=g)
        mask = torch.ones(2, trace_patches, dtype=torch.int32)
        mask[1, trace_patches // 2 :] = 0
        pw = torch.rand(2, trace_patches, grid * grid, generator=g)
        return pv, mask, pw

    return GraphSpec(
        name="vision",
        file="vision.onnx",
        inputs=[
            TensorSpec("pixel_values", "float32", ("batch", "num_patches", pp3)),
            TensorSpec("pixel_attention_mask", "int32", ("batch", "num_patches")),
            TensorSpec("position_weights", "float32", ("batch", "num_patches", grid * grid)),
        ],
        outputs=[TensorSpec("last_hidden_state", "float32", ("batch", "num_patches", d))],
        module=NaFlexVisionTower(vision_model).eval(),
        example=example,
        external_data=True,
    )


def vision_spec_fixed(vision_model, image_size: int) -> GraphSpec:
    d = vision_model.config.hidden_size
    n = (image_size // vision_model.config.patch_size) ** 2

    def example():
        return (torch.randn(2, 3, image_size, image_size, generator=torch.Generator().manual_seed(0)),)

    return GraphSpec(
        name="vision",
        file="vision.onnx",
        inputs=[TensorSpec("pixel_values", "float32", ("batch", 3, image_size, image_size))],
        outputs=[TensorSpec("last_hidden_state", "float32", ("batch", n, d))],
        module=FixedVisionTower(vision_model).eval(),
        example=example,
        external_data=True,
    )


def pool_spec(head, width: int, trace_tokens: int) -> GraphSpec:
    def example():
        g = torch.Generator().manual_seed(1)
        hidden = torch.randn(2, trace_tokens, width, generator=g)
        kpm = torch.zeros(2, trace_tokens, dtype=torch.bool)
        kpm[0, : trace_tokens // 3] = True
        return hidden, kpm

    return GraphSpec(
        name="pool",
        file="pool.onnx",
        inputs=[
            TensorSpec("hidden", "float32", ("batch", "num_tokens", width)),
            TensorSpec("key_padding_mask", "bool", ("batch", "num_tokens")),
        ],
        outputs=[
            TensorSpec("pooled", "float32", ("batch", width)),
            TensorSpec("attention", "float32", ("batch", "num_tokens")),
        ],
        module=MaskedPoolingHead(head).eval(),
        example=example,
        extra={"num_heads": int(head.attention.num_heads), "mask_value": MASK_VALUE},
    )


def text_spec(text_model, length: int, vocab_size: int) -> GraphSpec:
    proj = int(text_model.head.out_features)

    def example():
        return (torch.randint(0, vocab_size, (2, length), generator=torch.Generator().manual_seed(2)),)

    return GraphSpec(
        name="text",
        file="text.onnx",
        inputs=[TensorSpec("input_ids", "int64", ("batch", length))],
        outputs=[TensorSpec("text_embeds", "float32", ("batch", proj))],
        module=TextTower(text_model).eval(),
        example=example,
        external_data=True,
    )


def export_graph(spec: GraphSpec, path, opset: int = 18) -> None:
    """Export ``spec.module`` to ONNX at ``path`` with the spec's names and dynamic axes.

    Uses torch's dynamo exporter (``torch.onnx.export(..., dynamo=True)``) at opset >= 17 so
    LayerNorm stays one ``LayerNormalization`` node (TensorRT keeps it in fp32).
    """
    args = spec.example()
    arg_names = [t.name for t in spec.inputs]
    dims: dict[str, torch.export.Dim] = {}
    dynamic_shapes = {}
    for t, name in zip(spec.inputs, _forward_arg_names(spec.module)):
        axes = {}
        for i, ax in enumerate(t.shape):
            if isinstance(ax, str):
                dims.setdefault(ax, torch.export.Dim(ax, min=1, max=65536))
                axes[i] = dims[ax]
        dynamic_shapes[name] = axes
    with torch.inference_mode(False), torch.no_grad():
        prog = torch.onnx.export(
            spec.module,
            args,
            dynamo=True,
            opset_version=opset,
            input_names=arg_names,
            output_names=[t.name for t in spec.outputs],
            dynamic_shapes=dynamic_shapes,
            verbose=False,
            optimize=True,
        )
    external = spec.external_data or _needs_external_data(spec.module)
    if prog is None:  # only without dynamo=True (the TorchScript exporter writes the file itself)
        raise ValueError(f"torch.onnx.export returned no ONNX program for graph {spec.name}")
    if external:  # the writer appends to an existing data file
        Path(str(path) + ".data").unlink(missing_ok=True)
    prog.save(str(path), external_data=external)


def _forward_arg_names(module: nn.Module) -> list[str]:
    import inspect

    return [p for p in inspect.signature(module.forward).parameters]


def _needs_external_data(module: nn.Module) -> bool:
    """ONNX protobufs are capped at 2 GiB; so400m's vision tower alone is ~1.7 GB in fp32."""
    size = sum(p.numel() * p.element_size() for p in module.parameters())
    return size > 1_800_000_000
