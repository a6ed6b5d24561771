"""masc-export without the [export] extra: one line naming the extra, before any work or file."""

from __future__ import annotations

from click.testing import CliRunner

from masc_engine import extras
from masc_engine.cli.export_cmd import main


def test_masc_export_without_torch_names_the_extra(tmp_path, monkeypatch):
    real = extras.available
    monkeypatch.setattr(extras, "available", lambda m: m != "torch" and real(m))
    out = tmp_path / "b"
    r = CliRunner().invoke(main, ["--model", "random:tiny-naflex", "--out", str(out)])
    assert r.exit_code == 1, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: masc-export needs torch"), r.output
    assert "[export] extra" in lines[0]
    assert list(tmp_path.iterdir()) == []  # no bundle, no export log
