"""masc-serve's ``/metrics`` counts every route of the app under its own ``path`` label (the
labels come from the app's routes, so a route added later is counted too); any other path is
``"other"``. In process, without a bundle: requests answered 503 ``not_ready`` are counted as well.
"""

from __future__ import annotations

import re

import pytest

pytest.importorskip("fastapi", reason="masc-serve needs the serve extra")
from fastapi.testclient import TestClient  # noqa: E402

from masc_engine.serve.app import ServeConfig, create_app  # noqa: E402


def _counts(text: str) -> dict[str, int]:
    """``masc_requests_total`` summed over codes, by path label."""
    out: dict[str, int] = {}
    for path, n in re.findall(r'^masc_requests_total\{code="\d+",path="([^"]*)"\} (\S+)$', text, re.M):
        out[path] = out.get(path, 0) + int(float(n))
    return out


@pytest.mark.parametrize("docs", [False, True])
def test_every_route_has_its_own_label(tmp_path, docs):
    app = create_app(ServeConfig(bundle=str(tmp_path / "not-loaded"), docs=docs))
    client = TestClient(app)  # not entered: the bundle never loads, the scoring routes answer 503
    routes = [(r.path, sorted(r.methods)[0]) for r in app.routes]
    assert {"/v1/score", "/v1/score/upload", "/v1/score_batch", "/metrics"} <= {p for p, _ in routes}
    for path, method in routes:
        client.request(method, path)
    client.get("/no-such-path")
    client.post("/v1/score/upload/x")
    counts = _counts(client.get("/metrics").text)
    want = {p: sum(1 for q, _ in routes if q == p) for p, _ in routes}
    want["other"] = 2
    assert counts == want
