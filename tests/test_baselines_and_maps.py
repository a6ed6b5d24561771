"""Same-forward-pass baselines and attribution maps on real pairs."""

from __future__ import annotations

import math

import numpy as np
import pytest
from PIL import Image

from support import EXAMPLES, load_pair, read_rows, with_baselines
from masc_engine.jobs.pairs import RunOptions, BASELINE_COLUMNS, RunSettings, run_pairs
from masc_engine.jobs.results import read_output
from masc_engine.runtime import heads
from masc_engine.runtime.scorer import Pair, Scorer
from masc_engine.tolerances import FLOAT32_SAME_ARITHMETIC_ATOL, SELF_CP_ATOL


@pytest.fixture(scope="module")
def scored(naflex_bundle):
    pairs = [Pair(*load_pair(EXAMPLES, r)) for r in read_rows(EXAMPLES)]
    s = Scorer(naflex_bundle)
    return s, pairs, s.score_batch(pairs)


def test_baselines_agree_with_their_definitions(naflex_bundle, scored):
    s, pairs, plain = scored
    items = []
    encs = s.encode_images([p.ref_image for p in pairs] + [p.out_image for p in pairs])
    from masc_engine.runtime.masks import mask_to_patch_grid
    from masc_engine.runtime.scorer import EncodedPair

    n = len(pairs)
    for i, p in enumerate(pairs):
        r, o = encs[i], encs[n + i]
        items.append(
            EncodedPair(
                r,
                mask_to_patch_grid(p.ref_mask, r.grid),
                o,
                mask_to_patch_grid(p.out_mask, o.grid),
                p.prompt,
                p.object_name,
            )
        )
    res = with_baselines(s, items)
    for r, base, it in zip(res, plain, items, strict=True):
        ex = r.extras
        assert set(BASELINE_COLUMNS) <= set(ex)
        assert r.cp == pytest.approx(base.cp, abs=FLOAT32_SAME_ARITHMETIC_ATOL)
        assert r.pf == pytest.approx(base.pf, abs=FLOAT32_SAME_ARITHMETIC_ATOL)
        assert ex["pf_bg_stripped"] == pytest.approx(
            r.pf, abs=FLOAT32_SAME_ARITHMETIC_ATOL
        )  # PF is the bg/stripped cell
        assert -1 <= ex["cp_global"] <= 1 and 0 <= ex["cp_mnn_frac"] <= 1
        assert ex["cp_mnn"] <= r.cp + FLOAT32_SAME_ARITHMETIC_ATOL  # non-mutual patches count 0: never above CP
        # Global embedding = pooling head with nothing hidden.
        g = s.pool_background(
            [it.ref_enc, it.out_enc],
            [np.zeros(it.ref_enc.tokens.shape[0], bool), np.zeros(it.out_enc.tokens.shape[0], bool)],
        )[0]
        assert ex["cp_global"] == pytest.approx(heads.cosine(g[0], g[1]), abs=FLOAT32_SAME_ARITHMETIC_ATOL)
    # Identical reference and output: every patch is its own mutual nearest neighbour.
    it = items[0]
    same = with_baselines(s, [type(it)(it.ref_enc, it.ref_weights, it.ref_enc, it.ref_weights, "a toy", "toy")])[0]
    assert same.extras["cp_mnn_frac"] == 1.0 and same.extras["cp_mnn"] == pytest.approx(1.0, abs=SELF_CP_ATOL)
    assert same.extras["cp_global"] == pytest.approx(1.0, abs=SELF_CP_ATOL)


def test_maps_written_for_real_pairs(naflex_bundle, tmp_path):
    out = tmp_path / "scores.csv"
    maps = tmp_path / "maps"
    run_pairs(
        EXAMPLES / "pairs.csv",
        Scorer(naflex_bundle),
        out,
        RunSettings(baselines=True, save_maps=str(maps)),
        options=RunOptions(progress=False),
    )
    rows = read_output(out)
    assert len(rows) == 20
    for r in rows[:5]:
        cp_png, pf_png = tmp_path / r["cp_map"], tmp_path / r["pf_map"]  # relative to the output folder
        ref = Image.open(EXAMPLES / r["ref_image"])
        cp_im, pf_im = Image.open(cp_png), Image.open(pf_png)
        assert cp_im.size == ref.size and pf_im.size == Image.open(EXAMPLES / r["out_image"]).size
        # The overlay paints the reference foreground and darkens the rest: foreground pixels differ
        # from the photo more than background pixels do... and painted pixels carry ramp colours.
        mask = np.array(Image.open(EXAMPLES / r["ref_mask"]).convert("L")) > 127
        diff = np.abs(np.asarray(cp_im, float) - np.asarray(ref.convert("RGB"), float)).mean(-1)
        assert diff[mask].mean() > 10
        assert math.isfinite(float(r["cp_global"])) and math.isfinite(float(r["pf_full_unstripped"]))
    # The PF attention map is zero (unpainted, only darkened) on the hidden foreground.
    r = rows[0]
    out_im = np.asarray(Image.open(EXAMPLES / r["out_image"]).convert("RGB"), float)
    pf = np.asarray(Image.open(tmp_path / r["pf_map"]), float)
    fg = np.array(Image.open(EXAMPLES / r["out_mask"]).convert("L")) > 250
    ratio = pf[fg].mean() / max(out_im[fg].mean(), 1)
    assert ratio == pytest.approx(0.45, abs=0.08)  # darkened, not painted, on the core of the foreground
