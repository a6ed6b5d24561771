"""Table cells are bounded before they are expanded: a CSV cell past MAX_CELL_CHARS refuses the
file in one line naming the line (a 900 MB cell took 6.3 GB to parse), and a Parquet file whose
dictionary-encoded cells decode past the byte budget is refused before any cell is expanded (a
101 KB file of 1,000 rows sharing one 2 MB string ran out of memory at 2.3 GB)."""

from __future__ import annotations

import pytest

from masc_engine.jobs.tables import MAX_CELL_CHARS, TableError, read_table

HEADER = "ref_image,prompt\n"


def test_a_long_cell_below_the_bound_is_read(tmp_path):
    p = tmp_path / "p.csv"
    p.write_text(HEADER + "a.jpg," + "x" * 200_000 + "\n")
    assert len(read_table(p).rows[0]["prompt"]) == 200_000


def test_a_cell_past_the_bound_refuses_the_file_in_one_line(tmp_path):
    p = tmp_path / "p.csv"
    p.write_text(HEADER + "a.jpg,ok\n" + "b.jpg," + "x" * (MAX_CELL_CHARS + 10) + "\n")
    with pytest.raises(TableError) as e:
        read_table(p, max_bytes=2**30)
    assert ", line " in str(e.value) and "\n" not in str(e.value) and "field larger" in str(e.value)


def test_a_dictionary_bomb_in_parquet_is_refused_before_expansion(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    n, big = 1000, "a" * (2 * 2**20)
    prompt = pa.DictionaryArray.from_arrays(pa.array([0] * n, pa.int32()), pa.array([big]))
    p = tmp_path / "p.parquet"
    pq.write_table(pa.table({"ref_image": ["x.jpg"] * n, "prompt": prompt}), p, use_dictionary=True)
    assert p.stat().st_size < 2**20
    before = pa.total_allocated_bytes()
    with pytest.raises(TableError, match="once decoded") as e:
        read_table(p, max_bytes=2**30)
    assert "2097157000 bytes" in str(e.value)
    assert pa.total_allocated_bytes() - before < 64 * 2**20  # nothing was expanded


def test_parquet_cells_within_the_budget_read_as_before(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    p = tmp_path / "p.parquet"
    pq.write_table(pa.table({"ref_image": ["a.jpg", "b.jpg"], "prompt": ["x", "y"], "n": [1, 2]}), p)
    assert read_table(p, max_bytes=2**30).rows == [
        {"ref_image": "a.jpg", "prompt": "x", "n": 1},
        {"ref_image": "b.jpg", "prompt": "y", "n": 2},
    ]


def test_millions_of_tiny_rows_are_refused_as_they_are_read(tmp_path):
    """Rows cost memory beyond their text (ROW_MEMORY_BYTES each): a small file of many empty rows
    is refused while read, in one line naming the line, not held whole (5 million rows of ','
    took 3.4 GB)."""
    from masc_engine.jobs.tables import ROW_MEMORY_BYTES

    p = tmp_path / "p.csv"
    p.write_text("ref_image,prompt\n" + ",\n" * 5000)
    budget = p.stat().st_size + 1000 * ROW_MEMORY_BYTES
    with pytest.raises(TableError) as e:
        read_table(p, max_bytes=budget, budget_option="--max-pairs-mb")
    assert "1001 rows" in str(e.value) and "line 1002" in str(e.value) and "--max-pairs-mb" in str(e.value)
    assert len(read_table(p, max_bytes=p.stat().st_size + 5000 * ROW_MEMORY_BYTES).rows) == 5000
    j = tmp_path / "p.jsonl"
    j.write_text('{"a": 1}\n' * 5000)
    with pytest.raises(TableError, match="1001 rows"):
        read_table(j, max_bytes=j.stat().st_size + 1000 * ROW_MEMORY_BYTES)
