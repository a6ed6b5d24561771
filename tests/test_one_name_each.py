"""One name, one value: a table naming a column twice (CSV/TSV header, JSON key, Parquet field),
a request with two Authorization headers, and a JSON request body holding a key twice are refused
in one line naming what is repeated, never read as "the last one wins"."""

from __future__ import annotations

import asyncio
import json

import pytest
from click.testing import CliRunner

from support import EXAMPLES
from masc_engine.jobs.tables import TableError, read_table

ROW = EXAMPLES / "pairs.csv"


def _pairs_csv(tmp_path, header: str) -> tuple:
    """The example pairs file with its header replaced by ``header`` (one extra cell per row when
    the header has one more column)."""
    lines = ROW.read_text(encoding="utf-8").splitlines()
    extra = header.count(",") - lines[0].count(",")
    p = tmp_path / "pairs.csv"
    p.write_text("\n".join([header] + [ln + ",x" * extra for ln in lines[1:3]]) + "\n", encoding="utf-8")
    return p, lines[0]


def test_a_csv_header_naming_a_column_twice_is_refused_by_masc_run(naflex_bundle, tmp_path):
    from masc_engine.cli.run_cmd import main as run_main

    good = ROW.read_text(encoding="utf-8").splitlines()[0]
    p, _ = _pairs_csv(tmp_path, good + ",prompt")
    out = tmp_path / "o.csv"
    res = CliRunner().invoke(run_main, [str(p), "--bundle", str(naflex_bundle), "--out", str(out), "--no-progress"])
    assert res.exit_code == 1, res.output
    lines = [ln for ln in res.output.strip().splitlines() if not ln.startswith("WARNING: bundle")]  # random weights
    assert lines == [
        f"Error: bad_pairs_file: {p}: the header names column 'prompt' twice (columns 8 and 11: "
        "'prompt', 'prompt'); keep one column of each name"
    ]
    assert not out.exists()


@pytest.mark.parametrize(
    ("header", "first", "second", "spelled"),
    [
        ("a,prompt,b,prompt", 2, 4, "'prompt', 'prompt'"),
        ("a,prompt,b, prompt ", 2, 4, "'prompt', ' prompt '"),
        ("\ufeffprompt,b,\ufeffprompt", 1, 3, "'prompt', '\\ufeffprompt'"),  # the file's own BOM is dropped
    ],
)
def test_repeated_header_names_are_refused_naming_both_positions(tmp_path, header, first, second, spelled):
    p = tmp_path / "t.csv"
    p.write_text(header + "\n1,2,3,4\n", encoding="utf-8")
    with pytest.raises(TableError) as e:
        read_table(p, what="pairs")
    assert str(e.value) == (
        f"bad_pairs_file: {p}: the header names column 'prompt' twice (columns {first} and {second}: "
        f"{spelled}); keep one column of each name"
    )


def test_empty_header_cells_may_repeat_and_distinct_names_still_read(tmp_path):
    p = tmp_path / "t.tsv"
    p.write_text("prompt\tPrompt\t\t\nhello\tHi\t\t\n", encoding="utf-8")
    t = read_table(p, required=["prompt"], what="pairs")
    assert t.columns == ["prompt", "Prompt", "", ""]
    assert t.rows[0]["prompt"] == "hello" and t.rows[0]["Prompt"] == "Hi"
    # cells under them would fold into one key, all but one lost: refused (jobs/delimited.py)
    p.write_text("prompt\tPrompt\t\t\nhello\tHi\tx\ty\n", encoding="utf-8")
    with pytest.raises(TableError, match="line 2: column 3 holds a cell"):
        read_table(p, required=["prompt"], what="pairs")


def test_a_json_lines_row_holding_a_key_twice_is_refused_naming_the_line(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text('{"prompt": "a", "x": 1}\n\n{"x": 1, "prompt": "a", "prompt": "b"}\n', encoding="utf-8")
    with pytest.raises(TableError) as e:
        read_table(p, what="pairs")
    assert str(e.value) == (
        f"bad_pairs_file: {p}, line 3: key 'prompt' appears twice in one object (keys 2 and 3); "
        "keep one column of each name"
    )
    p.write_text('{"prompt": "a", "x": {"y": 1}}\n{"x": 1, "prompt": "b"}\n', encoding="utf-8")
    assert [r["prompt"] for r in read_table(p, what="pairs").rows] == ["a", "b"]


def test_a_json_array_row_holding_a_key_twice_is_refused_naming_the_row(tmp_path):
    p = tmp_path / "t.json"
    p.write_text('[{"prompt": "a"}, {"prompt": "b"}, {"prompt": "c", "prompt": "d"}]', encoding="utf-8")
    with pytest.raises(TableError) as e:
        read_table(p, what="pairs")
    assert str(e.value) == (
        f"bad_pairs_file: {p}, row 3: key 'prompt' appears twice in one object (keys 1 and 2); "
        "keep one column of each name"
    )
    p.write_text('[{"prompt": "a"}, {"prompt": "b"}]', encoding="utf-8")
    assert [r["prompt"] for r in read_table(p, what="pairs").rows] == ["a", "b"]


def test_a_parquet_schema_with_two_fields_of_one_name_is_refused(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    p = tmp_path / "t.parquet"
    cols = [pa.array(["a.png"]), pa.array(["a"]), pa.array(["b"])]
    pq.write_table(pa.Table.from_arrays(cols, names=["ref_image", "prompt", "prompt"]), p)
    with pytest.raises(TableError) as e:
        read_table(p, what="pairs")
    assert str(e.value) == (
        f"bad_pairs_file: {p}: the schema names column 'prompt' twice (columns 2 and 3: "
        "'prompt', 'prompt'); keep one column of each name"
    )
    pq.write_table(pa.Table.from_arrays(cols, names=["ref_image", "prompt", "object_name"]), p)
    assert read_table(p, what="pairs").rows == [{"ref_image": "a.png", "prompt": "a", "object_name": "b"}]


# ---------------------------------------------------------------------------------- masc-serve


KEY = b"k3y-0f-the-service"
ONE_HEADER = "one Authorization header is expected: send Authorization: Bearer <key> once"
WRONG = "send Authorization: Bearer <key> (the key of --api-key-file)"


def _guarded(headers: list[tuple[bytes, bytes]], key: bytes = KEY) -> tuple[int, dict | None]:
    """The status and JSON body RequestGuard answers a POST /v1/score carrying ``headers``
    (the app behind it answers 200 with no body)."""
    pytest.importorskip("starlette")
    from masc_engine.serve.limits import RequestGuard
    from masc_engine.serve.metrics import ServiceMetrics

    sent: list[dict] = []

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(msg):
        sent.append(msg)

    guard = RequestGuard(app, 2**20, 5.0, None, ServiceMetrics(), api_key=key)
    scope = {"type": "http", "method": "POST", "path": "/v1/score", "headers": headers}
    asyncio.run(guard(scope, receive, send))
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], (json.loads(body) if body else None)


@pytest.mark.parametrize(
    "values",
    [
        [b"Bearer " + KEY, b"Bearer wrong"],
        [b"Bearer wrong", b"Bearer " + KEY],
        [b"Bearer " + KEY, b"Bearer " + KEY],
        [b"Bearer " + KEY + b", Bearer wrong"],
        [b"Bearer wrong," + KEY],
    ],
)
def test_more_than_one_authorization_header_is_unauthorized_whichever_holds_the_key(values):
    status, body = _guarded([(b"authorization", v) for v in values])
    assert (status, body) == (401, {"error": "unauthorized", "field": None, "detail": ONE_HEADER})


def test_one_authorization_header_still_decides_alone():
    assert _guarded([(b"authorization", b"Bearer " + KEY)]) == (200, None)
    assert _guarded([(b"authorization", b"bearer  " + KEY + b" ")]) == (200, None)
    status, body = _guarded([(b"authorization", b"Bearer wrong")])
    assert (status, body) == (401, {"error": "unauthorized", "field": None, "detail": WRONG})
    # a key that itself holds a comma is still one token
    assert _guarded([(b"authorization", b"Bearer a,b")], key=b"a,b") == (200, None)


def test_a_json_body_holding_a_key_twice_is_refused():
    pytest.importorskip("fastapi")
    from masc_engine.serve.errors import ApiError
    from masc_engine.serve.parsing import _validate_once_each
    from masc_engine.serve.schemas import ScoreItem

    item = {k: "aGk=" for k in ("ref_image", "ref_mask", "out_image", "out_mask")}
    body = json.dumps({**item, "prompt": "a cat"})[:-1] + ', "prompt": "a dog"}'
    with pytest.raises(ApiError) as e:
        _validate_once_each(ScoreItem, bytearray(body.encode()))
    assert (e.value.status, e.value.error, e.value.field, e.value.detail) == (
        422,
        "bad_value",
        "prompt",
        "prompt: sent more than once in one JSON object",
    )
    nested = json.dumps({"items": [{**item, "prompt": "a"}]})[:-3] + ', "prompt": "b"}]}'
    with pytest.raises(ApiError):
        _validate_once_each(dict, bytearray(nested.encode()))
    ok = _validate_once_each(ScoreItem, bytearray(json.dumps({**item, "prompt": "a cat"}).encode()))
    assert ok.prompt == "a cat"
