"""Every results file in bench/results/ is traceable: it records when it was made (date), with what
(versions) and where (machine), and names its script. Text and Markdown renderings
sit beside a JSON record of the same stem."""

from __future__ import annotations

import json
from datetime import datetime

import pytest

from support import REPO

RESULTS = REPO / "bench" / "results"
JSON_FILES = sorted(RESULTS.glob("*.json"))


def test_there_are_results_files():
    assert len(JSON_FILES) >= 5


@pytest.mark.parametrize("path", JSON_FILES, ids=[p.name for p in JSON_FILES])
def test_results_file_records_date_versions_machine_script(path):
    d = json.loads(path.read_text(encoding="utf-8"))
    # one record per file, or one per run (a file that accumulates runs: {"runs": {name: record}})
    records = list(d["runs"].values()) if "date" not in d and isinstance(d.get("runs"), dict) else [d]
    assert records, path.name
    for r in records:
        datetime.fromisoformat(r["date"].replace("Z", "+00:00"))  # an ISO 8601 date, not a placeholder
        machine = r["machine"]
        assert isinstance(machine, dict) and machine, path.name
        versions = (
            r.get("versions")
            or machine.get("versions")
            or {k: v for k, v in machine.items() if k in ("onnxruntime", "torch", "transformers", "masc_engine")}
        )
        assert versions, f"{path.name}: no versions recorded"
    script = d.get("script") or f"bench/{path.stem.split('.')[0]}.py"
    if script.endswith(".py"):  # else a hand check, described in the file
        assert (REPO / script).is_file(), f"{path.name}: its script {script} is not in bench/"


@pytest.mark.parametrize(
    "path", sorted(p for p in RESULTS.iterdir() if p.suffix in (".txt", ".md")), ids=lambda p: p.name
)
def test_renderings_have_a_json_record(path):
    assert path.with_suffix(".json").is_file(), f"{path.name} has no {path.stem}.json beside it"
