"""Options several commands share are declared once (cli/options.py), their defaults read from
the dataclass field that owns each: masc-run's and masc-rank's ``--chunk-size`` / ``--io-workers``
from ``RunOptions``; ``--cache-dir`` / ``--cache-size-gb`` with one difference, named where they
are declared: masc-run writes the store's size out (8 GiB), masc-serve keeps ServeConfig's None."""

from __future__ import annotations

import dataclasses

import pytest

from masc_engine.cli import options
from masc_engine.cli.rank_cmd import main as rank_main
from masc_engine.cli.run_cmd import main as run_main
from masc_engine.jobs.pairs import RunOptions
from masc_engine.runtime.cache import DEFAULT_SIZE_LIMIT


def _params(command) -> dict:
    return {p.name: p for p in command.params}


def _field(cls, name):
    return {f.name: f.default for f in dataclasses.fields(cls)}[name]


def test_job_options_default_to_run_options_fields():
    run, rank = _params(run_main), _params(rank_main)
    assert run["chunk_size"].default == _field(RunOptions, "chunk_size") == 64
    assert run["io_workers"].default == rank["io_workers"].default == _field(RunOptions, "io_workers") == 4
    assert run["cache_dir"].default is _field(RunOptions, "cache_dir") is None
    assert run["cache_size_gb"].default == DEFAULT_SIZE_LIMIT / 2**30 == 8.0 and run["cache_size_gb"].show_default
    assert "(overlapping inference)" in run["io_workers"].help and "overlapping" not in rank["io_workers"].help


def test_a_changed_field_default_reaches_the_option(monkeypatch):
    monkeypatch.setitem(options._RUN_DEFAULTS, "io_workers", 7)
    assert options.io_workers_option()(lambda io_workers: None).__click_params__[0].default == 7


def test_serve_keeps_its_own_cache_size_default():
    state = pytest.importorskip("masc_engine.serve.state", exc_type=ImportError)
    from masc_engine.cli.serve_cmd import main as serve_main

    serve = _params(serve_main)
    assert serve["cache_size_gb"].default is _field(state.ServeConfig, "cache_size_gb") is None
    assert not serve["cache_size_gb"].show_default and "8 GiB" in serve["cache_size_gb"].help
    assert serve["cache_dir"].default is _field(state.ServeConfig, "cache_dir") is None
