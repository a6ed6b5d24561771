"""A classic column is filled only by the backbone its recipe names.

``--metrics dino --embedder dino=<a CLIP bundle>`` used to run and write CLIP's image cosines in
the ``dino`` column, with a sidecar naming facebook/dino-vits16. Each classic metric names its
embedder's family and ViT patch size (runtime/pair_metrics/classic.py ``BACKBONE_OF``); masc-run,
masc-serve and ``PairsJob`` refuse another before any work, in one line. A bundle passed to the
wrong option is named with the option it belongs to.
"""

from __future__ import annotations

import pytest

from masc_engine.engine.bundle import Bundle
from masc_engine.errors import BundleError
from masc_engine.jobs.pairs import RunSettings
from masc_engine.jobs.pairs.job import check_backbones
from masc_engine.runtime.pair_metrics.classic import BACKBONE_OF, COLUMN_RECIPES, EMBEDDER_OF, backbone_mismatch
from support import EXAMPLES


def _manifest(family: str, patch: int) -> dict:
    return {"family": family, "architecture": {"patch_size": patch}}


def test_each_classic_metric_takes_its_backbone_and_no_other():
    assert set(BACKBONE_OF) == set(EMBEDDER_OF) == set(COLUMN_RECIPES)
    backbones = set(BACKBONE_OF.values()) | {("dinov2", 16), ("clip", 16)}
    for metric, own in BACKBONE_OF.items():
        assert backbone_mismatch(metric, _manifest(*own)) is None
        for other in backbones - {own}:
            why = backbone_mismatch(metric, _manifest(*other))
            assert why and f"--metrics {metric}" in why and f"{other[0]} with {other[1]}-pixel" in why, (metric, other)
    assert "of no family" in backbone_mismatch("dino", {})
    # a manifest is input: fields of another type read as absent, never an AttributeError
    for hostile in ({"family": ["dino"], "architecture": [16]}, {"family": 7, "architecture": {"patch_size": "16"}}):
        assert "this bundle is of no family with unknown-pixel patches" in backbone_mismatch("dino", hostile)
    assert backbone_mismatch("cp", {}) is None  # not a classic metric


def test_masc_run_refuses_a_clip_bundle_as_the_dino_embedder(embedder_bundles, naflex_bundle, tmp_path):
    from click.testing import CliRunner

    from masc_engine.cli.run_cmd import main

    out = tmp_path / "s.csv"
    clip = embedder_bundles["clip-tiny"]
    argv = [str(EXAMPLES / "pairs.csv"), "--bundle", str(naflex_bundle), "--out", str(out)]
    res = CliRunner().invoke(main, [*argv, "--metrics", "cp,dino", "--embedder", f"dino={clip}"])
    assert res.exit_code == 1 and not out.exists()
    line = [ln for ln in res.output.splitlines() if ln.startswith("Error:")]
    assert line == [
        f"Error: --embedder dino={clip}: --metrics dino reads a dino embedder with 16-pixel patches "
        f"({COLUMN_RECIPES['dino']['checkpoint']}); this bundle is clip with 32-pixel patches"
    ], res.output


def test_the_job_refuses_loaded_embedders_of_another_backbone(embedder_bundles):
    from masc_engine.runtime.embedder import Embedder

    clip, dino = Embedder(embedder_bundles["clip-tiny"]), Embedder(embedder_bundles["dino-tiny-s16"])
    check_backbones(RunSettings(metrics=("clip_i", "clip_t", "dino")), {"clip": clip, "dino": dino})
    with pytest.raises(ValueError, match="--metrics clip_i reads a clip embedder with 32-pixel patches"):
        check_backbones(RunSettings(metrics=("clip_i",)), {"clip": dino})
    with pytest.raises(ValueError, match="--metrics dino_s8 reads a dino embedder with 8-pixel patches"):
        check_backbones(RunSettings(metrics=("dino_s8",)), {"dino_s8": dino})


def test_a_bundle_of_another_kind_names_the_option_it_belongs_to(embedder_bundles, seg_bundle):
    with pytest.raises(
        BundleError, match=r"is an embedder bundle, not a scorer bundle \(pass it as --embedder NAME=BUNDLE\)"
    ):
        Bundle(embedder_bundles["dino-tiny-s16"])
    with pytest.raises(BundleError, match=r"is a segmenter bundle, not an embedder bundle \(pass it as --segmenter\)"):
        Bundle(seg_bundle, kind="embedder")
