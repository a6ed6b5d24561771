"""The exporter's narrowed paths: where torch's or transformers' types allow a value the SigLIP2 /
CLIPSeg models never give, the exporter refuses with a named ValueError (not an AttributeError
deep inside the trace)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


def test_pool_head_without_multihead_attention_is_refused():
    from torch import nn

    from masc_engine.export.graphs import MaskedPoolingHead

    head = nn.Module()
    head.attention = nn.Linear(4, 4)
    with pytest.raises(ValueError, match="not torch.nn.MultiheadAttention"):
        MaskedPoolingHead(head)
    head.attention = nn.MultiheadAttention(8, 2, batch_first=True)
    assert MaskedPoolingHead(head).num_heads == 2


def test_export_without_a_program_is_refused(monkeypatch, tmp_path):
    from masc_engine.export import graphs
    from masc_engine.export.cp_head import cp_spec

    monkeypatch.setattr(torch.onnx, "export", lambda *a, **k: None)
    with pytest.raises(ValueError, match="no ONNX program for graph cp"):
        graphs.export_graph(cp_spec(8), tmp_path / "cp.onnx")
    assert not (tmp_path / "cp.onnx").exists()
