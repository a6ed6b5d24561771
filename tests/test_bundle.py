"""Bundle manifest, integrity checks and the export validator's failure mode."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from masc_engine.engine.bundle import Bundle
from masc_engine.errors import BackendUnavailableError, BundleError, ExportValidationError
from masc_engine.tolerances import EXPORT_VALIDATION_ATOL, export_validation_atol


def test_manifest_is_the_single_source_of_truth(naflex_bundle):
    m = json.loads((naflex_bundle / "manifest.json").read_text())
    assert m["source"]["random_weights"] is True and m["source"]["model"] == "random:tiny-naflex"
    img = m["image"]
    assert img["mode"] == "naflex" and img["max_num_patches"] == 1024 and img["patch_size"] == 16
    assert img["resample"] == "bilinear" and img["image_mean"] == [0.5, 0.5, 0.5] and img["position_grid"] == 16
    txt = m["text"]
    assert txt["max_length"] == 64 and txt["lowercase"] is True and txt["text_tower_attention_mask"] is False
    assert set(m["graphs"]) == {"vision", "pool", "text", "cp"}
    assert set(m["files"]) == {
        "tokenizer.json",
        "vision.onnx",
        "vision.onnx.data",
        "pool.onnx",
        "text.onnx",
        "text.onnx.data",
        "cp.onnx",
        "vision.ort-cpu.onnx",
        "text.ort-cpu.onnx",
    }  # + the fused variant, sharing the towers' weights (test_fusion.py)
    assert all(len(v) == 64 for v in m["files"].values())
    for k in ("torch", "transformers", "onnx", "onnxruntime", "tokenizers", "masc_engine"):
        assert m["versions"][k]
    for g in ("vision", "pool", "text"):  # validated right after export, on non-traced shapes
        assert m["validation"][g]["max_abs"] <= m["validation"][g]["atol"]
        assert len(m["validation"][g]["cases"]) >= 2


def test_fixed_manifest(fixed_bundle):
    m = json.loads((fixed_bundle / "manifest.json").read_text())
    assert m["image"]["mode"] == "fixed" and m["image"]["image_size"] == [128, 128]
    assert m["graphs"]["vision"]["inputs"][0]["shape"] == ["batch", 3, 128, 128]


def test_tampered_file_is_refused(naflex_bundle, tmp_path):
    copy = tmp_path / "b"
    shutil.copytree(naflex_bundle, copy)
    with open(copy / "pool.onnx", "ab") as f:
        f.write(b"\0")
    with pytest.raises(BundleError, match="pool.onnx"):
        Bundle(copy, verify="all")
    # by default each file is hashed before its first use: a run hashes only what it loads
    b = Bundle(copy)
    b.runner("vision")
    with pytest.raises(BundleError, match="pool.onnx"):
        b.runner("pool")
    Bundle(copy, verify=False).runner("text")  # unchecked: loads
    (copy / "pool.onnx").unlink()
    with pytest.raises(BundleError, match="missing"):
        Bundle(copy)


def test_other_format_version_and_missing_dir(naflex_bundle, tmp_path):
    with pytest.raises(BundleError, match="does not exist"):
        Bundle(tmp_path / "nope")
    copy = tmp_path / "b"
    shutil.copytree(naflex_bundle, copy)
    m = json.loads((copy / "manifest.json").read_text())
    m["format_version"] = 99
    (copy / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(BundleError, match="Re-export"):
        Bundle(copy)


def test_unknown_provider_and_backend(naflex_bundle):
    b = Bundle(naflex_bundle)
    with pytest.raises(BackendUnavailableError):
        b.runner("vision", provider="NoSuchExecutionProvider")
    with pytest.raises(BackendUnavailableError):
        b.runner("vision", backend="nonesuch")


def test_validator_fails_hard_on_a_wrong_graph(naflex_bundle):
    pytest.importorskip("torch")
    from transformers import AutoModel

    from support import checkpoint_dir
    from masc_engine.export.validate import validate_pool

    model = AutoModel.from_pretrained(checkpoint_dir(naflex_bundle)).eval()
    real = Bundle(naflex_bundle).runner("pool")

    class OffByALittle:  # a pooling head that ignores the key_padding_mask
        def run(self, feeds):
            return real.run({**feeds, "key_padding_mask": np.zeros_like(feeds["key_padding_mask"])})

    assert (
        validate_pool(real, model)["max_abs"]
        < export_validation_atol("pool", model.config.vision_config.hidden_size)[0]
    )
    with pytest.raises(ExportValidationError) as e:
        validate_pool(OffByALittle(), model)
    assert e.value.report["max_abs"] > EXPORT_VALIDATION_ATOL and "cases" in e.value.report
