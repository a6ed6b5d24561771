"""masc-serve refuses an object name exactly when masc-run does (docs/service.md: a request's
record is masc-run's row for the same files and text): over the token budget (the bundle's
tokenizer), masc-run's row is ``object_name_too_long`` and the service answers 422
``prompt_too_long`` naming ``object_name``, whatever stripper the request names; within it, both
score. masc-run is the oracle, run as a user runs it."""

from __future__ import annotations

import shutil

import pytest
from click.testing import CliRunner

from support import EXAMPLES
from masc_engine.cli.run_cmd import main as run_main
from masc_engine.jobs.results import read_output
from masc_engine.jobs.tables import write_table

pytest.importorskip("fastapi", reason="masc-serve needs the serve extra")
from masc_engine.runtime.scorer import Scorer  # noqa: E402
from masc_engine.runtime.text import PromptBudget  # noqa: E402
from masc_engine.serve.glue import FieldError, ServiceScorer  # noqa: E402

TOKENS = 6  # --max-prompt-tokens of both: the tiny tokenizer reads "cat" as 2 tokens, "cat cat" as 5
FILES = {"ref_image": "cat0.jpg", "ref_mask": "cat0.png", "out_image": "cat1.jpg", "out_mask": "cat1.png"}
NAMES = ["cat", "cat cat", "cat cat cat", "cat " * 10, "fluffy orange tabby cat with a hat"]


def _masc_run(bundle, folder) -> dict[str, dict]:
    for i in (0, 1):
        shutil.copy(EXAMPLES / f"images/cat/0{i}.jpg", folder / f"cat{i}.jpg")
        shutil.copy(EXAMPLES / f"masks/cat/0{i}.png", folder / f"cat{i}.png")
    rows = [{"key": f"k{i}", **FILES, "prompt": "a cat", "object_name": n} for i, n in enumerate(NAMES)]
    pairs = write_table(folder / "pairs.csv", rows, list(rows[0]))
    out = folder / "out.csv"
    args = [str(pairs), "--bundle", str(bundle), "--out", str(out), "--no-progress"]
    res = CliRunner().invoke(run_main, [*args, "--max-prompt-tokens", str(TOKENS)])
    assert res.exit_code == 0, res.output
    return {r["key"]: r for r in read_output(out)}


def test_an_object_name_is_refused_exactly_when_masc_run_refuses_it(naflex_bundle, tmp_path):
    rows = _masc_run(naflex_bundle, tmp_path)
    statuses = [rows[f"k{i}"]["status"] for i in range(len(NAMES))]
    assert statuses[0] == "ok" and "object_name_too_long" in statuses  # both sides of the budget
    service = ServiceScorer(Scorer(naflex_bundle), prompt_budget=PromptBudget(max_tokens=TOKENS))
    files = {k: (tmp_path / v).read_bytes() for k, v in FILES.items()}
    for i, (name, status) in enumerate(zip(NAMES, statuses)):
        for stripper in (None, "none"):
            try:
                item = service.decode(files, "a cat", name, stripper, f"items[{i}].")
            except FieldError as e:
                assert status == "object_name_too_long", (name, status, e.detail)
                assert (e.reason, e.field) == ("prompt_too_long", f"items[{i}].object_name")
                assert e.detail == f"items[{i}].{rows[f'k{i}']['status_detail']}"  # masc-run's words
            else:
                assert status == "ok" and item.error is None, (name, status)
