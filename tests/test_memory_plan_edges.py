"""The export's memory plan at its edges, pinned by values (export/stages.py, export/config_budget.py).

What these pin: a plan exactly at ``--max-memory-gb`` passes and a fractional limit is kept to the
byte; each stage's record in the manifest (``export_stages``: seconds to 0.1 s, peak and end RSS in
GB, the process that ran it); the config's plan follows the export it precedes (the fused variant,
bf16's converter); a config size that is a float only counts when it is an exact integer below
2**63; a config.json of exactly the byte cap is read; the offline switch's spellings; a local
folder without config.json names no bundle kind; CLIPSeg's decoder counts its extract layers;
long library errors are cut to one line of 300 characters; DINOv2's ``mlp_ratio`` is a width from
0 to 1024, its ends included.
"""

from __future__ import annotations

import json

import pytest

from masc_engine.export import config_budget, stages
from masc_engine.export.checkpoint import CheckpointError

#: google/siglip2-so400m-patch16-naflex's vision tower with a one-layer text tower: the fused
#: variant's stage (two copies of the largest graph) is then the plan's peak.
ONE_TOWER = {
    "model_type": "siglip2",
    "vision_config": {"hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 27, "num_patches": 256},
    "text_config": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1, "vocab_size": 100},
}


def _plan(peak: int) -> stages.MemoryPlan:
    return stages.MemoryPlan({"torch": peak}, {"vision": peak})


def test_a_plan_exactly_at_the_limit_fits():
    line = stages.check_memory_plan(_plan(2_000_000_000), 2, "m")
    assert line.endswith("within --max-memory-gb 2 (2.0 GB)")
    with pytest.raises(stages.ExportMemoryError, match=r"more than --max-memory-gb 2 \(2\.0 GB\)"):
        stages.check_memory_plan(_plan(2_000_000_001), 2, "m")


def test_a_fractional_limit_is_kept_to_the_byte():
    assert stages.check_memory_plan(_plan(2_500_000_000), 2.6, "m").endswith("within --max-memory-gb 2.6 (2.6 GB)")
    with pytest.raises(stages.ExportMemoryError, match=r"more than --max-memory-gb 2\.4 \(2\.4 GB\)"):
        stages.check_memory_plan(_plan(2_500_000_000), 2.4, "m")


def test_each_stage_record_has_its_figures_and_process():
    clock = stages.StageClock()
    clock.record("export text", 12.34, 3_216_000_000, 2_904_000_000, "exported text", " (torch worker)")
    clock.record("validate text", 0.96, 1_500_000_000, 1_250_000_000, "validated text")
    assert clock.records == [
        {
            "stage": "export text",
            "seconds": 12.3,
            "peak_rss_gb": 3.216,
            "rss_gb_after": 2.904,
            "process": "torch worker",
        },
        {"stage": "validate text", "seconds": 1.0, "peak_rss_gb": 1.5, "rss_gb_after": 1.25, "process": "exporter"},
    ]


def _peak_stage(line: str) -> str:
    return line.split(" stage")[0].rsplit(" ", 1)[1]


def test_the_config_plan_has_the_fused_stage_only_when_the_fused_variant_is_made():
    """One large tower: the fused variant's stage peaks above the torch and validate stages."""
    fused = config_budget.check_config_budget("m", ONE_TOWER, 100, "fp32", fused=True)
    portable = config_budget.check_config_budget("m", ONE_TOWER, 100, "fp32", fused=False)
    assert (_peak_stage(fused), _peak_stage(portable)) == ("fuse", "validate")


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_the_config_plan_of_reduced_graphs_peaks_in_the_converter(precision):
    assert _peak_stage(config_budget.check_config_budget("m", ONE_TOWER, 100, precision)) == "precision"
    assert _peak_stage(config_budget.check_config_budget("m", ONE_TOWER, 100, "fp32")) == "fuse"


def _vision_layers(value) -> dict:
    return {**ONE_TOWER, "vision_config": {**ONE_TOWER["vision_config"], "num_hidden_layers": value}}


def test_a_float_size_counts_only_as_an_exact_integer_below_2_63():
    params, shapes = config_budget.estimate_parameters(_vision_layers(27.0))
    assert shapes["vision"]["num_hidden_layers"] == 27
    assert params == config_budget.estimate_parameters(ONE_TOWER)[0]
    with pytest.raises(CheckpointError, match="num_hidden_layers must be a non-negative integer, got '1e"):
        config_budget.estimate_parameters(_vision_layers(1e300))


def test_zero_layers_is_a_count():
    params, shapes = config_budget.estimate_parameters(_vision_layers(0))
    assert shapes["vision"]["num_hidden_layers"] == 0 and 0 < params["vision"] < params["pool"]


def test_a_config_json_of_exactly_the_cap_is_read(tmp_path):
    body = json.dumps({"model_type": "siglip"}).encode()
    path = tmp_path / "config.json"
    path.write_bytes(body + b" " * (config_budget.MAX_CONFIG_BYTES - len(body)))
    assert config_budget.read_config_json(path, "m") == {"model_type": "siglip"}
    path.write_bytes(body + b" " * (config_budget.MAX_CONFIG_BYTES + 1 - len(body)))
    with pytest.raises(CheckpointError, match="over 4 MiB"):
        config_budget.read_config_json(path, "m")


@pytest.mark.parametrize("value, want", [("1", True), ("on", True), ("Yes", True), ("true", True), ("0", False)])
def test_offline_spellings(value, want, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", value)
    assert config_budget.offline() is want


def test_a_local_folder_without_config_json_names_no_kind(tmp_path):
    assert config_budget.names_model_of_kind(str(tmp_path), None, (), (), ("clipseg",)) is False
    (tmp_path / "config.json").write_text('{"model_type": "clipseg"}')
    assert config_budget.names_model_of_kind(str(tmp_path), None, (), (), ("clipseg",)) is True


def test_the_clipseg_decoder_counts_its_extract_layers():
    cfg = {"model_type": "clipseg", "extract_layers": [3, 6, 9]}
    three, shapes = config_budget.estimate_parameters(cfg)
    two, fewer = config_budget.estimate_parameters({**cfg, "extract_layers": [6, 9]})
    assert (shapes["decoder"]["layers"], fewer["decoder"]["layers"]) == (3, 2)
    assert two["decoder"] < three["decoder"] and (two["vision"], two["text"]) == (three["vision"], three["text"])


def test_a_long_library_error_is_one_line_of_300_characters():
    assert config_budget._first_line(ValueError("x" * 400)) == "x" * 300 + "..."
    assert config_budget._first_line(ValueError("x" * 300)) == "x" * 300
    assert config_budget._first_line(ValueError("a\n  b")) == "a b"
    assert config_budget._first_line(ValueError("")) == "ValueError"


@pytest.mark.parametrize("ratio", [0, 4, 1024])
def test_dinov2_mlp_ratio_from_0_to_1024_is_a_width(ratio):
    params, shapes = config_budget.estimate_parameters({"model_type": "dinov2", "mlp_ratio": ratio})
    assert shapes["image"]["intermediate_size"] == 768 * ratio and params["image"] > 0


@pytest.mark.parametrize("ratio", [-1, 1024.5, True, "4"])
def test_dinov2_mlp_ratio_outside_0_to_1024_is_one_line(ratio):
    with pytest.raises(CheckpointError, match="mlp_ratio must be a number from 0 to 1024"):
        config_budget.estimate_parameters({"model_type": "dinov2", "mlp_ratio": ratio})
