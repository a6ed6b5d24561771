"""Every bundle a command loads from random weights says so in one ``WARNING:`` line on stderr
(docs/commands.md), not as a Python warning pointing into click: the scorer's, the segmenter's
and each embedder's (cli/options.py ``_one_line_warnings``)."""

from __future__ import annotations

import warnings

from masc_engine.cli import options
from masc_engine.engine.bundle import RandomWeightsWarning


class _RandomEmbedder:
    """Stands in for runtime/embedder.py ``Embedder`` on a random-weights bundle: it warns as
    engine/bundle.py ``Bundle`` does when it opens one."""

    def __init__(self, path: str) -> None:
        self.path = path
        warnings.warn(
            f"bundle {path} was exported from random weights (random:clip-tiny)", RandomWeightsWarning, stacklevel=2
        )


def test_a_random_weights_embedder_is_one_warning_line(monkeypatch, capsys):
    monkeypatch.setattr("masc_engine.runtime.embedder.Embedder", _RandomEmbedder)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a Python warning escaping would raise here
        loaded = options.load_embedders({"clip": "/b/clip", "dino": "/b/dino"})
    assert {k: e.path for k, e in loaded.items()} == {"clip": "/b/clip", "dino": "/b/dino"}
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "WARNING: bundle /b/clip was exported from random weights (random:clip-tiny)",
        "WARNING: bundle /b/dino was exported from random weights (random:clip-tiny)",
    ]
