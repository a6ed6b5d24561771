"""masc-report reads only what the person making the report allows.

A score file (and its sidecar) may come from someone else, and the page it makes is meant to be
shared: its image and mask cells must not turn "send me the report" into "send me any image you
can read". Images are read only under the score file's folder and the ``--image-root`` folders
(real paths: no ``../``, absolute path or symlink leads out), each file past masc-run's pixel
limit is refused from its header, and every label (method names included) is drawn as text.
"""

from __future__ import annotations

import re
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from masc_engine import report as rp
from masc_engine.cli.report_cmd import main as report_main
from masc_engine.jobs.results import write_output

OUTSIDE = "not shown: outside the allowed folders"


def _png(path: Path, color, size=(32, 24)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, color).save(path)
    return path


def _png_header_only(path: Path, width: int, height: int) -> Path:
    """A PNG whose header claims ``width x height`` RGB pixels, with a few bytes of pixel data
    (a decompression bomb's header costs nothing to write)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")
    )
    return path


def _row(i: int, ref: str, out: str, **kw) -> dict:
    return {
        "key": f"k{i}",
        "method": "m",
        "ref_image": ref,
        "ref_mask": "",
        "out_image": out,
        "out_mask": "",
        "prompt": f"p{i}",
        "row_index": i,
        "cp": 0.9 - 0.01 * i,
        "pf": 0.1 + 0.01 * i,
        "status": "ok",
        **kw,
    }


def _scores(run: Path, rows: list[dict]) -> Path:
    run.mkdir(parents=True, exist_ok=True)
    path = run / "scores.csv"
    write_output(path, rows, list(rows[0]))
    return path


def _report(path: Path, **kw) -> str:
    rows, meta = rp.load_scores(path)
    return rp.build_report(
        rows, meta, scores_path=path, options=rp.ReportOptions(top_k=len(rows), n_resamples=50, **kw)
    )


def _figure_of_row(text: str, row: int, alt: str) -> str:
    """The first figure (image or placeholder) of ``alt``'s side in the best-CP table's row ``row``."""
    tr = re.search(rf'<tr data-row="{row}">(.*?)</tr>', text, re.DOTALL).group(1)
    figs = re.findall(r"<figure.*?</figure>", tr, re.DOTALL)
    return figs[0 if alt == "reference" else 1]


@pytest.fixture()
def layout(tmp_path):
    """``run/`` holds the score file and one image; ``secret/`` (beside it) an image nobody
    allowed; ``run/img/link.png`` is a symlink to the secret; ``run/img/inner_link.png`` a symlink
    that stays inside ``run/``."""
    run, secret = tmp_path / "run", tmp_path / "secret"
    ok = _png(run / "img" / "ok.png", (10, 200, 10))
    hidden = _png(secret / "s.png", (250, 0, 250))
    (run / "img" / "link.png").symlink_to(hidden)
    (run / "img" / "inner_link.png").symlink_to(ok)
    rows = [
        _row(1, "img/ok.png", "img/inner_link.png"),
        _row(2, str(hidden), "img/ok.png"),  # an absolute path out of the run
        _row(3, "../secret/s.png", "img/ok.png"),  # a relative path out of the run
        _row(4, "img/link.png", "img/ok.png"),  # a symlink out of the run
        _row(5, "img/ok.png", "img/ok.png", ref_mask="../secret/s.png"),
    ]  # a mask out of the run
    return {"run": run, "secret": secret, "hidden": hidden, "scores": _scores(run, rows)}


def test_only_images_under_the_score_files_folder_are_read(layout, monkeypatch):
    opened = []
    real_open = Image.open
    monkeypatch.setattr(Image, "open", lambda fp, *a, **k: opened.append(str(fp)) or real_open(fp, *a, **k))
    text = _report(layout["scores"], image_root=str(layout["run"]))
    assert not any("secret" in p for p in opened)  # the secret file was never opened
    for row in (2, 3, 4):
        fig = _figure_of_row(text, row, "reference")
        assert f'data-reason="{OUTSIDE}"' in fig and "<img" not in fig, fig
    for row, side in ((1, "reference"), (1, "output")):  # inside, a symlink that stays inside included
        assert 'src="data:image/jpeg;base64,' in _figure_of_row(text, row, side)
    masked = _figure_of_row(text, 5, "reference")
    assert 'src="data:image/jpeg;base64,' in masked and f"mask: {OUTSIDE}" in masked  # plain thumbnail, a note
    assert "images read only under" in text and html_escape(str(layout["run"].resolve())) in text


def html_escape(s: str) -> str:
    import html

    return html.escape(s, quote=True)


def test_image_root_allows_a_folder_and_the_cli_repeats_it(layout):
    page = layout["run"] / "r.html"
    res = CliRunner().invoke(
        report_main,
        [
            str(layout["scores"]),
            "--out",
            str(page),
            "--top",
            "5",
            "--n-resamples",
            "50",
            "--image-root",
            str(layout["run"]),
            "--image-root",
            str(layout["secret"]),
        ],
    )
    assert res.exit_code == 0, res.output
    text = page.read_text(encoding="utf-8")
    for row in (2, 3, 4):  # now allowed: the secret folder was named
        assert 'src="data:image/jpeg;base64,' in _figure_of_row(text, row, "reference")
    assert OUTSIDE not in text and "not shown" not in res.output


def test_default_report_embeds_nothing_from_outside(layout):
    page = layout["run"] / "r.html"
    res = CliRunner().invoke(report_main, [str(layout["scores"]), "--out", str(page), "--n-resamples", "50"])
    assert res.exit_code == 0, res.output
    # the console says so too, once, counting distinct files (the two spellings of the secret file
    # that rows 3 and 5 share are one path): a silent console reads as a complete report
    said = [ln for ln in res.output.splitlines() if OUTSIDE.split(": ", 1)[1] in ln]
    assert said == [
        "3 image or mask file(s) not shown: outside the allowed folders (the score file's folder and "
        "--image-root; add the folder holding them with --image-root)"
    ], res.output
    text = page.read_text(encoding="utf-8")
    assert text.count(f'data-reason="{OUTSIDE}"') >= 3 * 2  # rows 2-4 in the best and worst tables of CP and PF
    thumbs = rp.Thumbnails(144)  # the report's thumbnail size, no confinement: the caller's own file
    secret_uri, _ = thumbs.get(layout["hidden"])  # what the secret looks like as a thumbnail
    assert secret_uri is not None and secret_uri not in text


def test_pixel_limit_is_masc_runs_and_refused_from_the_header(tmp_path, monkeypatch):
    assert rp.pixel_limit() == Image.MAX_IMAGE_PIXELS == 89_478_485  # runtime/io.py's refusal (Pillow's limit)
    bomb = _png_header_only(tmp_path / "bomb.png", 13_300, 13_300)  # 176.9 Mpx: under 200 Mpx and 2x Pillow's
    thumbs = rp.Thumbnails(48, roots=rp.allowed_roots(tmp_path / "scores.csv"))
    uri, why = thumbs.get(bomb)
    assert uri is None and why == "too large (13300x13300 pixels, over 89,478,485)"
    small = _png(tmp_path / "small.png", (1, 2, 3), size=(40, 40))
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # the limit is read when a Thumbnails is made
    uri, why = rp.Thumbnails(48, roots=rp.allowed_roots(tmp_path / "scores.csv")).get(small)
    assert uri is None and why == "too large (40x40 pixels, over 1,000)"
    rows = [_row(1, "small.png", "small.png", ref_mask="bomb.png")]
    text = _report(_scores(tmp_path, rows))
    assert 'data-reason="too large (40x40 pixels, over 1,000)"' in text


def test_mask_thumbnails_use_the_format_allowlist(tmp_path, monkeypatch):
    from PIL import EpsImagePlugin

    called = []
    monkeypatch.setattr(EpsImagePlugin, "Ghostscript", lambda *a, **k: called.append(a))
    _png(tmp_path / "ok.png", (9, 9, 9))
    (tmp_path / "m.png").write_bytes(b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 8 8\nshowpage\n%%EOF\n")
    big = _png_header_only(tmp_path / "big.png", 13_300, 13_300)
    thumbs = rp.Thumbnails(48, roots=rp.allowed_roots(tmp_path / "scores.csv"))
    uri, why, note = thumbs.with_mask(tmp_path / "ok.png", tmp_path / "m.png")
    assert uri is not None and why is None and note == "mask: unreadable (UnidentifiedImageError)" and not called
    uri, why, note = thumbs.with_mask(tmp_path / "ok.png", big)
    assert uri is not None and note == "mask: too large (13300x13300 pixels, over 89,478,485)"


def test_method_names_are_drawn_as_text_not_mathtext(tmp_path):
    names = ["$\\foo$", "$x^{2}$", "plain"]
    rows = [
        _row(i, "", "", method=names[i % 3], cp=float(v), pf=float(v) / 4)
        for i, v in enumerate(np.linspace(0.2, 0.9, 9))
    ]
    text = _report(_scores(tmp_path, rows))
    plots = re.search(r'<section id="distributions">(.*?)</section>', text, re.DOTALL).group(1)
    assert "$x^{2}$" in plots and "$\\foo$" in plots  # the characters themselves, not a formula
    for name in names:
        assert f'data-method="{html_escape(name)}"' in text
