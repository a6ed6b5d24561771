"""The registered metrics' values, statuses and notes on stand-in encodings (no bundle): CP/PF
statuses and notes, the mutual-nearest-neighbour CP, the global CP and the pooled PF grid."""

from __future__ import annotations

import math
from types import SimpleNamespace as NS

import numpy as np
import pytest

from masc_engine.runtime import heads
from masc_engine.runtime import pair_metrics as pm
from masc_engine.tolerances import FLOAT32_SAME_ARITHMETIC_ATOL

NAN = float("nan")


def _enc(tokens, grid=(1, 3)):
    return NS(tokens=np.asarray(tokens, np.float32), grid=grid)


def _batch(items, results=(), scorer=None, **kw):
    return pm.MetricBatch(
        items=items, results=results, host_tokens=lambda e: e.tokens, fg_threshold=0.5, scorer=scorer, **kw
    )


def test_cp_status_and_note_say_why_cp_is_undefined():
    it = NS(ref_enc=_enc([[1, 0]] * 6, grid=(2, 3)))
    res = [NS(cp=0.5), NS(cp=NAN), NS(cp=NAN)]
    got = pm.get_metric("cp").compute(
        _batch([it] * 3, res, ref_any_foreground=(True, False, True), ref_mask_names=("a.png", "b.png", "c.png"))
    )
    assert got[0] == {"cp": 0.5, "status": "ok"}
    assert got[1]["status"] == "empty_reference_mask"
    assert got[1]["note"] == "b.png has no foreground pixel: CP undefined, PF scored"
    assert got[2]["status"] == "reference_mask_below_threshold"
    assert got[2]["note"] == "c.png: no patch of the 2x3 grid has mask weight > 0.5: CP undefined, PF scored"
    unnamed = pm.get_metric("cp").compute(_batch([it], [NS(cp=NAN)]))[0]
    assert unnamed["status"] == "reference_mask_below_threshold" and unnamed["note"].startswith("the reference mask:")


def test_pf_status_and_note():
    got = pm.get_metric("pf").compute(_batch([None, None], [NS(pf=0.25), NS(pf=NAN)]))
    assert got[0] == {"pf": 0.25, "status": "ok"}
    assert got[1]["status"] == "no_background" and math.isnan(got[1]["pf"])
    assert got[1]["note"] == "the output mask hides every patch: PF undefined, CP scored"


def _mnn_item():
    ref = _enc([[1, 0], [1, 0.1], [0, 1]])  # the third is background
    out = _enc([[1, 0], [0, 1]], grid=(1, 2))
    return NS(ref_enc=ref, ref_weights=np.array([1, 1, 0], np.float32), out_enc=out)


def test_cp_mnn_counts_only_mutual_matches():
    got = pm.get_metric("cp_mnn").compute(_batch([_mnn_item()]))[0]
    assert got["cp_mnn"] == pytest.approx(0.5, abs=FLOAT32_SAME_ARITHMETIC_ATOL) and got["cp_mnn_frac"] == 0.5


def test_cp_mnn_is_nan_without_reference_foreground():
    it = _mnn_item()
    it.ref_weights = np.array([0.5, 0.2, 0], np.float32)  # 0.5 is not above the threshold
    got = pm.get_metric("cp_mnn").compute(_batch([it]))[0]
    assert math.isnan(got["cp_mnn"]) and math.isnan(got["cp_mnn_frac"])


class _Scorer:
    """Pooling = the mean of the unhidden tokens (NaN when every one is hidden); texts by length."""

    def __init__(self):
        self.pool_calls = 0

    def pool_background(self, encs, kpms):
        self.pool_calls += 1
        out = []
        for e, k in zip(encs, kpms):
            kept = e.tokens[~np.asarray(k)]
            out.append(kept.mean(axis=0) if len(kept) else np.full(e.tokens.shape[1], np.nan, np.float32))
        return np.stack(out).astype(np.float32), None

    def encode_texts(self, texts):
        return np.array([[1.0, float(len(t))] for t in texts], np.float32), None


def test_cp_global_and_pf_pooling_follow_their_definitions_and_share_the_global_pooling():
    ref = _enc([[1, 0], [0, 1], [1, 1]])
    out = _enc([[2, 1], [0, 3], [1, 0]])
    it = NS(
        ref_enc=ref,
        out_enc=out,
        ref_weights=np.array([1, 0, 0], np.float32),
        out_weights=np.array([1, 1, 0], np.float32),
        prompt="a red toy",
    )
    res = NS(extras={"prompt_text": "a red"})
    s = _Scorer()
    b = _batch([it], [res], scorer=s)
    cg = pm.get_metric("cp_global").compute(b)[0]
    pf = pm.get_metric("pf_pooling").compute(b)[0]
    assert s.pool_calls == 3  # one global pooling for both metrics, then background and foreground
    assert cg["cp_global"] == pytest.approx(
        heads.cosine(ref.tokens.mean(0), out.tokens.mean(0)), abs=FLOAT32_SAME_ARITHMETIC_ATOL
    )
    regions = {"full": out.tokens.mean(0), "bg": out.tokens[2], "fg": out.tokens[:2].mean(0)}
    texts = {"stripped": np.array([1.0, 5.0]), "unstripped": np.array([1.0, 9.0])}
    for r, v in regions.items():
        for k, t in texts.items():
            assert pf[f"pf_{r}_{k}"] == pytest.approx(heads.cosine(v, t), abs=FLOAT32_SAME_ARITHMETIC_ATOL), (r, k)
    assert len({round(x, 6) for x in pf.values()}) == 6


def test_pf_pooling_is_nan_for_an_empty_region():
    out = _enc([[2, 1], [0, 3]], grid=(1, 2))
    it = NS(
        ref_enc=out, out_enc=out, ref_weights=np.ones(2, np.float32), out_weights=np.ones(2, np.float32), prompt="toy"
    )
    pf = pm.get_metric("pf_pooling").compute(_batch([it], [NS(extras={"prompt_text": ""})], scorer=_Scorer()))[0]
    assert math.isnan(pf["pf_bg_stripped"]) and math.isnan(pf["pf_bg_unstripped"])
    assert not math.isnan(pf["pf_fg_stripped"]) and not math.isnan(pf["pf_full_unstripped"])
