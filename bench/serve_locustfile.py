"""Locust user for bench/serve_load.py: a closed-loop client posting /v1/score.

Each user sends its next request as soon as the previous one is answered (no think time), so the
number of users is the number of concurrent clients. Request bodies are prepared JSON (four
base64 files, prompt, object_name) read from the JSON-lines file named by ``MASC_BENCH_BODIES``;
users take them round-robin from a random start. Any status other than 200, or a 200 without a
numeric ``cp``, counts as a failure.
"""

from __future__ import annotations

import itertools
import os
import random

from locust import HttpUser, constant, task

with open(os.environ["MASC_BENCH_BODIES"], "rb") as f:
    BODIES = [line.rstrip(b"\n") for line in f if line.strip()]


class ScoreClient(HttpUser):
    wait_time = constant(0)

    def on_start(self):
        start = random.randrange(len(BODIES))
        self._bodies = itertools.islice(itertools.cycle(BODIES), start, None)

    @task
    def score(self):
        with self.client.post(
            "/v1/score",
            data=next(self._bodies),
            headers={"content-type": "application/json"},
            catch_response=True,
            timeout=300,
        ) as r:
            if r.status_code != 200:
                r.failure(f"HTTP {r.status_code}: {r.text[:200]}")
            elif not isinstance(r.json().get("cp"), float):
                r.failure(f"no cp: {r.text[:200]}")
