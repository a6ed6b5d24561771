"""The encoder's runner lifetime, the LRU's bound, the probe routes and the response record,
pinned by values on stand-ins (no bundle): a value the size of the cache is kept, close releases
every runner once, GET is documented and HEAD is not, undeclared record fields are dropped and
a registered metric's columns become typed fields."""

from __future__ import annotations

import threading

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from masc_engine.runtime import pair_metrics as pm
from masc_engine.runtime.encoder import LRU, Encoder
from masc_engine.serve import schemas
from masc_engine.serve.routes import _probe


def test_a_value_the_size_of_the_cache_is_kept():
    lru = LRU(4, getsizeof=len)
    lru["a"] = b"1234"
    assert dict(lru) == {"a": b"1234"} and lru.currsize == 4


class _Runner:
    def __init__(self, graph, log):
        self.graph, self.log = graph, log

    def close(self):
        self.log.append(("close", self.graph))


def _encoder(log) -> Encoder:
    e = object.__new__(Encoder)
    e._runners, e._runner_lock = {}, threading.Lock()

    def make(graph):
        log.append(("make", graph))
        return _Runner(graph, log)

    e._make_runner = make
    return e


def test_a_runner_is_made_once_and_close_releases_each_once():
    log = []
    e = _encoder(log)
    v = e.runner("vision")
    assert e.runner("vision") is v and e.runner("text").graph == "text"
    assert log == [("make", "vision"), ("make", "text")]
    e.close()
    e.close()
    assert log[2:] == [("close", "vision"), ("close", "text")]
    with pytest.raises(RuntimeError, match="closed"):
        e.runner("vision")
    with pytest.raises(RuntimeError, match="closed"):
        e.replace_runner("vision", object())


def test_the_probe_is_documented_for_get_only_and_answers_both():
    app = FastAPI()

    @_probe(app, "/p", summary="probe")
    async def p() -> dict:
        return {"status": "alive"}

    doc = app.openapi()
    assert set(doc["paths"]["/p"]) == {"get"}
    c = TestClient(app)
    assert (c.get("/p").status_code, c.get("/p").json()) == (200, {"status": "alive"})
    h = c.head("/p")
    assert (h.status_code, h.content) == (200, b"")


def test_undeclared_record_fields_are_dropped():
    rec = schemas.ScoreResult.model_validate(
        {
            "cp": 0.5,
            "pf": None,
            "status": "ok",
            "status_detail": "",
            "row_index": 3,
            "row_key": "k",
            "secret_path": "/x",
        }
    )
    dumped = rec.model_dump()
    assert "row_index" not in dumped and "secret_path" not in dumped and dumped["cp"] == 0.5


def test_a_registered_metric_adds_typed_fields_and_its_status():
    assert schemas._metric_fields() == {} and schemas._score_result() is schemas._BuiltinScoreResult
    pm.register(
        pm.PairMetric(
            name="zz_field",
            columns=("zz_field", "zz_field_n"),
            description="d",
            compute=lambda b: [],
            status_column="zz_field_status",
        )
    )
    try:
        assert set(schemas._metric_fields()) == {"zz_field", "zz_field_n", "zz_field_status"}
        model = schemas._score_result()
        r = model.model_validate(
            {"cp": 0.1, "pf": 0.2, "status": "ok", "status_detail": "", "zz_field": 0.5, "zz_field_status": "ok"}
        ).model_dump()
        assert (r["zz_field"], r["zz_field_n"], r["zz_field_status"]) == (0.5, None, "ok")
        with pytest.raises(ValueError):
            model.model_validate({"cp": 0.1, "pf": 0.2, "status": "ok", "status_detail": "", "zz_field": "high"})
    finally:
        pm.base._REGISTRY.pop("zz_field", None)
