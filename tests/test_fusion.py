"""The fused ``ort-cpu`` graph variant: ONNX Runtime's transformer fusions with the
key_padding_mask carried into the Attention kernel, stored beside the portable graphs, validated
against PyTorch, picked explicitly by the runtime for ONNX Runtime on CPU."""

from __future__ import annotations

import json
import shutil
import warnings

import numpy as np
import pytest

from support import EXAMPLES, blob_mask, grid_image
from masc_engine.engine.bundle import Bundle
from masc_engine.engine.manifest import read_manifest, sha256_file, write_manifest
from masc_engine.errors import BackendUnavailableError, BundleError
from masc_engine.tolerances import EXPORT_VALIDATION_ATOL, FUSED_TOKENS_ATOL, ORACLE_SCORE_ATOL, export_validation_atol

onnx = pytest.importorskip("onnx")


def _attention_nodes(path):
    m = onnx.load(str(path))
    return m, [n for n in m.graph.node if n.op_type == "Attention" and n.domain == "com.microsoft"]


def test_manifest_records_fusions_and_validation(any_bundle):
    bundle = any_bundle  # a session fixture: built before the test, not inside it (no process started here)
    m = read_manifest(bundle)
    kind = m["image"]["mode"]  # naflex or fixed
    v = m["variants"]["ort-cpu"]
    assert v["runtime"] == {"backend": "onnxruntime", "provider": "cpu"}
    assert v["transform"] == "ort-fusion" and v["graphs"] == ["vision", "text"]
    layers = {"vision": m["architecture"]["vision_layers"], "text": 2}  # tiny presets: 2 text layers
    # one record per fused graph in the transform pipeline's list (export/transforms.py)
    recs = {r["graph"]: r for r in m["transforms"] if r["transform"] == "ort-fusion"}
    assert set(recs) == {"vision", "text"}
    for g in ("vision", "text"):
        rec = recs[g]
        assert rec["variant"] == "ort-cpu" and rec["file"] == f"{g}.ort-cpu.onnx" and rec["file"] in m["files"]
        # One copy of the weights on disk: the fused graph reads the portable graph's weight file
        # (its packed QKV is a Concat of the portable Q, K and V); nothing else of size is its own.
        assert m["graphs"][g]["variants"]["ort-cpu"] == {
            "file": rec["file"],
            "transform": "ort-fusion",
            "external_data": [f"{g}.onnx.data"],
        }
        assert m["graphs"][g]["external_data"] == [f"{g}.onnx.data"]
        shared = rec["facts"]["external_data"]
        assert shared["shared_with"] == [f"{g}.onnx.data"] and shared["packed_qkv_as_concat"] == layers[g]
        assert shared["own_bytes"] == 0 and not (bundle / f"{g}.ort-cpu.onnx.data").exists()
        for f in (rec["file"], f"{g}.onnx.data"):
            assert sha256_file(bundle / f) == m["files"][f]
        # every attention block fused, its Softmax gone, GELU and residual LayerNorms fused
        facts = rec["facts"]
        assert facts["fusions"]["Attention"] == layers[g] == facts["adapter"]["attention_blocks"]
        assert (
            facts["fusions"]["FastGelu"] == layers[g]
            and facts["fusions"]["SkipLayerNormalization"] >= 2 * layers[g] - 1
        )
        assert rec["op_counts_before"]["Softmax"] == layers[g] and "Softmax" not in rec["op_counts_after"]
        assert rec["nodes_after"] < rec["nodes_before"] / 3
        # validated against PyTorch by the pipeline with the fp32 budgets
        assert rec["gates"] == "fp32" and rec["validation"]["max_abs"] <= EXPORT_VALIDATION_ATOL
        model, attn = _attention_nodes(bundle / rec["file"])
        assert len(attn) == layers[g]
        assert sum(n.op_type == "Attention" for n in model.graph.node) == layers[g]
    # NaFlex: the padding mask reaches every Attention node as the raw 2-D pixel_attention_mask.
    _, attn = _attention_nodes(bundle / "vision.ort-cpu.onnx")
    masks = {n.input[3] if len(n.input) > 3 else "" for n in attn}
    assert masks == ({"pixel_attention_mask"} if kind == "naflex" else {""})
    if kind == "naflex":
        from masc_engine.export.graphs import MASK_VALUE

        values = {
            onnx.helper.get_attribute_value(a) for n in attn for a in n.attribute if a.name == "mask_filter_value"
        }
        assert values == {MASK_VALUE} and recs["vision"]["facts"]["adapter"]["padding_masks"] == layers["vision"]
    val = v["validation"]
    assert val["scores"]["max_abs"] <= ORACLE_SCORE_ATOL and val["scores"]["pairs"] == 12
    # the portable graphs stay standard-op (TensorRT builds them)
    for g in ("vision", "text", "pool", "cp"):
        assert all(n.domain in ("", "ai.onnx") for n in onnx.load(str(bundle / m["graphs"][g]["file"])).graph.node)


def test_fused_vision_carries_any_key_padding_mask(naflex_bundle):
    """Fused vs portable tokens with padding slots holding large garbage, padding at the end and
    in the middle of a sequence: a fusion that dropped or misplaced the mask would differ by O(1)."""
    b = Bundle(naflex_bundle)
    fused, portable = b.runner("vision", variant="ort-cpu"), b.runner("vision")
    rng = np.random.default_rng(0)
    n, pp3, g2 = 53, 3 * 16 * 16, b.manifest["image"]["position_grid"] ** 2
    feeds = {
        "pixel_values": rng.normal(size=(3, n, pp3)).astype(np.float32),
        "pixel_attention_mask": np.ones((3, n), np.int32),
        "position_weights": rng.random((3, n, g2)).astype(np.float32),
    }
    feeds["pixel_attention_mask"][1, 31:] = 0
    feeds["pixel_attention_mask"][2, 5:20] = 0
    keep = feeds["pixel_attention_mask"].astype(bool)
    feeds["pixel_values"][~keep] *= 1e3
    a = portable.run(feeds)["last_hidden_state"]
    f = fused.run(feeds)["last_hidden_state"]
    assert np.abs(f - a)[keep].max() <= FUSED_TOKENS_ATOL
    # the same real patches without the padding slots give the same tokens
    short = {k: v[1:2, :31] for k, v in feeds.items()}
    assert np.abs(fused.run(short)["last_hidden_state"][0] - f[1, :31]).max() <= FUSED_TOKENS_ATOL


def test_fusion_keeps_biases_and_layernorm_weights(naflex_bundle, tmp_path):
    """The random test models have zero biases and unit LayerNorm weights; a fusion that lost a
    bias or a LayerNorm weight would pass on them. Perturb every parameter, export, fuse, check."""
    torch = pytest.importorskip("torch")
    from transformers import AutoModel, AutoProcessor

    from support import checkpoint_dir
    from masc_engine.export import fusion, graphs

    ckpt = checkpoint_dir(naflex_bundle)
    model = AutoModel.from_pretrained(ckpt, attn_implementation="eager").eval()
    processor = AutoProcessor.from_pretrained(ckpt)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    m = read_manifest(naflex_bundle)
    shutil.copy(naflex_bundle / "tokenizer.json", tmp_path / "tokenizer.json")
    vm, tm = model.vision_model, model.text_model
    torch.set_grad_enabled(False)
    graphs.export_graph(
        graphs.vision_spec_naflex(vm, 16, m["image"]["position_grid"], trace_patches=64), tmp_path / "vision.onnx"
    )
    graphs.export_graph(
        graphs.text_spec(tm, m["text"]["max_length"], int(model.config.text_config.vocab_size)), tmp_path / "text.onnx"
    )
    graphs.export_graph(graphs.pool_spec(vm.head, vm.config.hidden_size, trace_tokens=48), tmp_path / "pool.onnx")
    from masc_engine.export.transforms import run_transforms
    from masc_engine.export.validate import validate_graph

    graph_entries = {g: {"file": f"{g}.onnx"} for g in ("vision", "text", "pool")}
    check = lambda g, path, gates: validate_graph(g, path, tmp_path, model, processor, m["image"], m["text"], gates)  # noqa: E731
    recs = run_transforms(tmp_path, graph_entries, [fusion.FusionTransform.for_model(model)], check)
    assert [r["graph"] for r in recs] == ["vision", "text"]
    width = model.config.vision_config.hidden_size  # the portable graphs' budgets (3e-6 measured)
    assert all(r["validation"]["max_abs"] < export_validation_atol(r["graph"], width)[0] for r in recs)
    scores = fusion.validate_variant_scores(tmp_path, graph_entries, model, processor, m["image"], m["text"])
    assert scores["max_abs"] <= ORACLE_SCORE_ATOL
    # and a real bias reached the packed QKV bias of the Attention nodes
    fused = onnx.load(str(tmp_path / "vision.ort-cpu.onnx"))
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in fused.graph.initializer}
    attn = [n for n in fused.graph.node if n.op_type == "Attention"]
    q_bias = vm.encoder.layers[0].self_attn.q_proj.bias.numpy()
    assert np.array_equal(inits[attn[0].input[2]][: q_bias.size], q_bias)


def test_unknown_mask_form_is_refused(naflex_bundle, tmp_path):
    """A mask the adapter does not recognise must stop the fusion, not be dropped."""
    from masc_engine.export.fusion import FusionError, fuse_graph

    m = onnx.load(str(naflex_bundle / "vision.onnx"))
    eq = next(n for n in m.graph.node if n.op_type == "Equal")
    const = next(t for t in m.graph.initializer if t.name == eq.input[1])
    const.CopyFrom(
        onnx.numpy_helper.from_array(np.array(2, onnx.helper.tensor_dtype_to_np_dtype(const.data_type)), const.name)
    )
    onnx.save(m, str(tmp_path / "vision.onnx"))
    with pytest.raises(FusionError, match="does not know"):
        fuse_graph(tmp_path / "vision.onnx", tmp_path / "fused.onnx", 4, 64)
    assert not (tmp_path / "fused.onnx").exists()


def test_runtime_picks_the_variant_explicitly(naflex_bundle, tmp_path):
    from masc_engine import Scorer

    s = Scorer(naflex_bundle)
    assert s.graph_variant == "ort-cpu"
    assert s.vision.path.endswith("/vision.ort-cpu.onnx") and s.pool.path.endswith("/pool.onnx")
    p = Scorer(naflex_bundle, graph_variant="portable")
    assert p.graph_variant == "portable"
    im_r, im_o = grid_image((14, 18), seed=1), grid_image((18, 14), seed=2)
    args = (
        im_r,
        blob_mask(im_r.height, im_r.width, 1),
        im_o,
        blob_mask(im_o.height, im_o.width, 2),
        "a dog on the beach",
        "dog",
    )
    a, b = s.score(*args), p.score(*args)
    assert abs(a.cp - b.cp) <= ORACLE_SCORE_ATOL and abs(a.pf - b.pf) <= ORACLE_SCORE_ATOL
    with pytest.raises(BackendUnavailableError, match="ort-cpu"):
        Bundle(naflex_bundle).resolve_variant("ort-cpu", "onnxruntime", "cuda")
    assert Bundle(naflex_bundle).resolve_variant("auto", "onnxruntime", "cuda") == "portable"
    # A bundle without the variant: auto is portable, asking for ort-cpu is an error.
    old = tmp_path / "old"
    shutil.copytree(naflex_bundle, old, ignore=shutil.ignore_patterns("*.ort-cpu.onnx*"))
    man = read_manifest(old)
    man.pop("variants")
    for g in man["graphs"].values():
        g.pop("variants", None)
    man["files"] = [f for f in man["files"] if ".ort-cpu." not in f]
    write_manifest(old, man)
    assert Scorer(old).graph_variant == "portable"
    with pytest.raises(BundleError, match="no 'ort-cpu' graph variant"):
        Scorer(old, graph_variant="ort-cpu")
    # the fused graphs' external weights (the portable graph's file they share) are checked before
    # use like every other file, whichever variant reads them
    bad = tmp_path / "bad"
    shutil.copytree(naflex_bundle, bad)
    with open(bad / "vision.onnx.data", "ab") as f:
        f.write(b"\0")
    for variant in ("auto", "portable"):
        with pytest.raises(BundleError, match="vision.onnx.data"):
            Scorer(bad, graph_variant=variant)
    Scorer(naflex_bundle, graph_variant="portable")


def _one_copy_per_graph(bundle, dst):
    """``bundle`` laid out as exports wrote it before the fused graphs shared the portable graphs'
    weights: portable graphs with their weights inline, fused graphs with a full packed copy of
    theirs in ``<file>.data``, and no ``external_data`` in the manifest."""
    from masc_engine.export.fusion import fuse_graph

    shutil.copytree(bundle, dst)
    m = read_manifest(bundle)
    rec = next(r for r in m["transforms"] if r["transform"] == "ort-fusion")
    towers = {g: (t["num_heads"], t["hidden_size"]) for g, t in rec["settings"]["towers"].items()}
    apart = dst / "apart"
    apart.mkdir()
    for g in ("vision", "text"):
        fused = f"{g}.ort-cpu.onnx"
        fuse_graph(bundle / f"{g}.onnx", apart / fused, *towers[g])  # another folder: nothing shared
        for f in (fused, fused + ".data"):
            shutil.move(str(apart / f), str(dst / f))
        onnx.save(onnx.load(str(bundle / f"{g}.onnx")), str(dst / f"{g}.onnx"))  # weights inline
        (dst / f"{g}.onnx.data").unlink()
        m["graphs"][g].pop("external_data")
        m["graphs"][g]["variants"]["ort-cpu"].pop("external_data")
    apart.rmdir()
    m["files"] = sorted(p.name for p in dst.iterdir() if p.name != "manifest.json")
    write_manifest(dst, m)
    return dst


def test_shared_weights_score_like_a_copy_per_graph(naflex_bundle, tmp_path):
    """The bundle stores each weight once (the fused graphs read the portable graphs' weight files,
    their packed QKV a Concat of the portable Q, K and V), and scores the shipped pairs exactly as a
    bundle with a full copy per graph, which still loads (bundles written before the change)."""
    from support import load_pair, read_rows
    from masc_engine import Scorer

    old = _one_copy_per_graph(naflex_bundle, tmp_path / "old")
    fused = lambda d: sum(p.stat().st_size for p in d.glob("*.ort-cpu.onnx*"))  # noqa: E731
    assert fused(naflex_bundle) < 0.2 * fused(old)  # the fused graphs' files: structure, not weights
    from masc_engine import Pair

    pairs = [Pair(*load_pair(EXAMPLES, r)) for r in read_rows(EXAMPLES)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        new_s, old_s = Scorer(naflex_bundle), Scorer(old)
        assert new_s.graph_variant == old_s.graph_variant == "ort-cpu"
        a, b = new_s.score_batch(pairs), old_s.score_batch(pairs)
    assert len(a) == len(pairs) >= 20
    assert [(r.cp, r.pf) for r in a] == [(r.cp, r.pf) for r in b]  # same weights, same kernels: bit-equal


def test_masc_run_records_the_variant(naflex_bundle, tmp_path):
    from click.testing import CliRunner

    from masc_engine.cli.run_cmd import main

    pairs = tmp_path / "pairs.csv"
    lines = (EXAMPLES / "pairs.csv").read_text().splitlines()
    pairs.write_text("\n".join(lines[:3]) + "\n")
    for f in ("images", "masks"):
        shutil.copytree(EXAMPLES / f, tmp_path / f)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for variant in ("auto", "portable"):
            out = tmp_path / f"{variant}.csv"
            res = CliRunner().invoke(
                main,
                [
                    str(pairs),
                    "--bundle",
                    str(naflex_bundle),
                    "--out",
                    str(out),
                    "--graph-variant",
                    variant,
                    "--no-progress",
                ],
            )
            assert res.exit_code == 0, res.output
            meta = json.loads((tmp_path / f"{variant}.csv.meta.json").read_text())
            assert meta["settings"]["graph_variant"] == ("ort-cpu" if variant == "auto" else "portable")
