"""Inputs that break naive runners: each gets a per-row status (or a documented conversion) and
never stops the run."""

from __future__ import annotations

import csv
import math
import os

import numpy as np
import pytest
from PIL import Image

from support import EXAMPLES
from masc_engine.jobs.pairs import RunOptions, RunSettings, run_pairs
from masc_engine.jobs.results import read_output
from masc_engine.runtime.io import load_image, load_mask, mask_coverage
from masc_engine.runtime.scorer import Scorer
from masc_engine.tolerances import JPEG_MASK_COVERAGE_ATOL

SRC_IMG, SRC_MASK = EXAMPLES / "images/cat/00.jpg", EXAMPLES / "masks/cat/00.png"


def _exif_rotated(im, path_out, orientation=6):
    """Store the pixels rotated so that applying EXIF ``orientation`` restores the original."""
    stored = im.transpose(Image.Transpose.ROTATE_90)  # orientation 6 = rotate 270 to display
    exif = Image.Exif()
    exif[0x0112] = orientation
    stored.save(path_out, exif=exif.tobytes(), **({"quality": 95} if str(path_out).endswith(".jpg") else {}))


def _png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header claims ``width x height`` (a decompression bomb, without the bytes)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


@pytest.fixture()
def zoo(tmp_path):
    d = tmp_path
    # Not square, so that a 90-degree rotation changes the size.
    im = Image.open(SRC_IMG).convert("RGB").crop((0, 0, 512, 384))
    mask = Image.open(SRC_MASK).convert("L").crop((0, 0, 512, 384))
    im.save(d / "plain.png")
    mask.save(d / "mask.png")
    _exif_rotated(im, d / "exif_img.jpg")
    _exif_rotated(mask, d / "exif_mask.png")
    mask.transpose(Image.Transpose.ROTATE_90).save(d / "mask_rotated_noexif.png")
    im.convert("RGBA").save(d / "rgba.png")
    im.convert("LA").save(d / "la.png")
    p = im.convert("P")
    p.info["transparency"] = 0
    p.save(d / "p_transparent.png", transparency=0)
    Image.fromarray((np.asarray(im.convert("L")).astype(np.uint16) * 257)).save(d / "grey16.png")
    im.convert("CMYK").save(d / "cmyk.jpg")
    mask.save(d / "mask.jpg", quality=75)  # JPEG noise around 0 and 255
    pal = Image.fromarray((np.asarray(mask) > 127).astype(np.uint8), "P")
    pal.putpalette([0, 0, 0, 0, 0, 1] + [0] * 762)  # index 1 = nearly black: convert("L") would give ~0
    pal.save(d / "mask_palette.png")
    mask.crop((0, 0, mask.width - 2, mask.height)).save(d / "mask_2px_off.png")
    (d / "bomb.png").write_bytes(_png_header_only(30000, 30000))  # 900 Mpixel claimed
    return d


ROWS = {  # key: (out_image, out_mask, expected status)
    "plain": ("plain.png", "mask.png", "ok"),
    "exif_both": ("exif_img.jpg", "exif_mask.png", "ok"),
    "exif_img_plain_mask": ("exif_img.jpg", "mask.png", "ok"),
    "exif_mask_fits_other_orientation": ("exif_img.jpg", "mask_rotated_noexif.png", "mask_orientation_mismatch"),
    "rgba": ("rgba.png", "mask.png", "ok"),
    "la": ("la.png", "mask.png", "ok"),
    "palette_transparency": ("p_transparent.png", "mask.png", "ok"),
    "grey16": ("grey16.png", "mask.png", "ok"),
    "cmyk": ("cmyk.jpg", "mask.png", "ok"),
    "jpeg_mask": ("plain.png", "mask.jpg", "ok"),
    "palette_mask": ("plain.png", "mask_palette.png", "ok"),
    "mask_2px_off": ("plain.png", "mask_2px_off.png", "mask_size_mismatch"),
    "bomb": ("bomb.png", "mask.png", "image_too_large"),
}


def _pairs(zoo) -> str:
    path = zoo / "pairs.csv"
    with open(path, "w", newline="", encoding="utf-8-sig") as f:
        w = csv.writer(f)
        w.writerow(["key", "ref_image", "ref_mask", "out_image", "out_mask", "prompt", "object_name"])
        for key, (img, m, _) in ROWS.items():
            w.writerow([key, "plain.png", "mask.png", img, m, 'a cat, "quoted",\non the beach — ünïcødé', "cat"])
    return path


def test_every_bad_input_kind_gets_its_status(naflex_bundle, zoo):
    out = zoo / "out.csv"
    summary = run_pairs(_pairs(zoo), Scorer(naflex_bundle), out, options=RunOptions(progress=False))
    rows = {r["key"]: r for r in read_output(out)}
    assert summary.rows == len(ROWS)
    for key, (_, _, status) in ROWS.items():
        assert rows[key]["status"] == status, (key, rows[key]["status_detail"])
        assert rows[key]["prompt"] == 'a cat, "quoted",\non the beach — ünïcødé'
        if status == "ok":
            assert math.isfinite(float(rows[key]["cp"])) and math.isfinite(float(rows[key]["pf"]))
    plain = float(rows["plain"]["cp"])
    # EXIF applied to image and mask alike: the same pixels as the plain file, up to JPEG loss.
    assert abs(float(rows["exif_both"]["cp"]) - plain) < 0.05
    assert "16-bit" in rows["grey16"]["status_detail"] and "alpha" in rows["rgba"]["status_detail"]
    # JPEG and palette masks read as the PNG mask: same coverage (to JPEG noise), same patches.
    assert (
        abs(float(rows["jpeg_mask"]["out_mask_coverage"]) - float(rows["plain"]["out_mask_coverage"]))
        < JPEG_MASK_COVERAGE_ATOL
    )
    assert rows["palette_mask"]["pf_n_bg_pooled"] == rows["plain"]["pf_n_bg_pooled"]
    assert "bomb.png" in rows["bomb"]["status_detail"]


def test_mask_tolerance_stretches_small_offsets(naflex_bundle, zoo):
    out = zoo / "tol.csv"
    run_pairs(
        _pairs(zoo), Scorer(naflex_bundle), out, RunSettings(mask_size_tolerance=2), options=RunOptions(progress=False)
    )
    row = {r["key"]: r for r in read_output(out)}["mask_2px_off"]
    assert row["status"] == "ok" and "stretched" in row["status_detail"]


def test_exif_ignore_reads_stored_pixels(zoo):
    applied, stored = load_image(str(zoo / "exif_img.jpg")), load_image(str(zoo / "exif_img.jpg"), exif="ignore")
    assert applied.size == (512, 384) and stored.size == (384, 512)


def test_mask_readers():
    m = load_mask(str(SRC_MASK))
    assert m.dtype == np.uint8 and m.ndim == 2 and set(np.unique(m)) <= {0, 255}
    assert mask_coverage(np.array([[0, 3], [200, 255]], np.uint8)) == 0.5  # JPEG-noise 3 is background
    assert mask_coverage(np.array([[0.0, 0.6]], np.float32)) == 0.5


def test_paper_filter_keeps_rows_with_reason(naflex_bundle, zoo, tmp_path):
    tiny = np.zeros((384, 512), np.uint8)
    tiny[:20, :20] = 255  # well under 5% coverage
    Image.fromarray(tiny).save(zoo / "tiny_mask.png")
    path = zoo / "filter.csv"
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["key", "ref_image", "ref_mask", "out_image", "out_mask", "prompt", "object_name"])
        w.writerow(["ok", "plain.png", "mask.png", "plain.png", "mask.png", "a cat", "cat"])
        w.writerow(["small_out", "plain.png", "mask.png", "plain.png", "tiny_mask.png", "a cat", "cat"])
        w.writerow(["small_ref", "plain.png", "tiny_mask.png", "plain.png", "mask.png", "a cat", "cat"])
    out = tmp_path / "f.csv"
    s = run_pairs(
        path,
        Scorer(naflex_bundle),
        out,
        RunSettings(min_output_mask_frac=0.05, min_reference_mask_frac=0.05),
        options=RunOptions(progress=False),
    )
    status = {r["key"]: r["status"] for r in read_output(out)}
    assert status == {"ok": "ok", "small_out": "filtered_output_mask", "small_ref": "filtered_reference_mask"}
    assert s.statuses["filtered_output_mask"] == 1 and s.statuses["filtered_reference_mask"] == 1
    # The threshold is a parameter: at 0.05% (below the 20x20 square's 0.2%) nothing is dropped
    # (other settings on the same output: replaced only when asked).
    s = run_pairs(
        path,
        Scorer(naflex_bundle),
        out,
        RunSettings(min_output_mask_frac=0.0005, min_reference_mask_frac=0.0005),
        options=RunOptions(progress=False, overwrite=True),
    )
    assert s.statuses["ok"] == 3


# ------------------------------------------------------------------ formats and decoder failures


def _fake_gs(tmp_path, monkeypatch):
    """A recording ``gs`` first on PATH, and Pillow's cached Ghostscript lookup reset."""
    from PIL import EpsImagePlugin

    record = tmp_path / "gs-calls.txt"
    (tmp_path / "bin").mkdir()
    gs = tmp_path / "bin" / "gs"
    gs.write_text(f'#!/bin/sh\necho "gs $*" >> {record}\nexit 1\n')
    gs.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ.get('PATH', '')}")
    monkeypatch.setattr(EpsImagePlugin, "gs_binary", None)
    return record


def test_formats_outside_the_allowlist_are_refused_before_any_decoder(tmp_path, monkeypatch):
    import io

    from masc_engine.errors import InputError
    from masc_engine.runtime.io import IMAGE_FORMATS, image_from_bytes, mask_from_bytes

    record = _fake_gs(tmp_path, monkeypatch)
    im = Image.new("RGB", (24, 16), (10, 200, 30))
    for fmt in ("EPS", "PDF", "GIF", "PPM", "DDS", "ICO", "TGA"):
        b = io.BytesIO()
        im.save(b, fmt)
        for read, reason in ((image_from_bytes, "unreadable_image"), (mask_from_bytes, "unreadable_mask")):
            with pytest.raises(InputError) as e:
                read(b.getvalue(), f"x.{fmt.lower()}")
            assert e.value.reason == reason and "JPEG, PNG, WebP, TIFF or BMP" in e.value.detail, fmt
    for fmt in IMAGE_FORMATS:  # the allowed ones still read
        b = io.BytesIO()
        im.save(b, fmt)
        assert image_from_bytes(b.getvalue(), f"x.{fmt.lower()}")[0].size == (24, 16)
    assert not record.exists()  # Ghostscript never ran


@pytest.mark.parametrize(
    "exc",
    [
        NotImplementedError("unimplemented pixel format"),
        __import__("struct").error("bad"),
        IndexError("tile out of range"),
        KeyError("mode"),
        ZeroDivisionError("stride"),
        MemoryError(),
    ],
)
def test_any_decoder_exception_is_the_files_status(exc, monkeypatch):
    """Pillow decoders raise more than OSError on hostile bytes: each kind becomes the file's
    InputError (a status in masc-run, 422 in masc-serve), never an exception past the reader."""
    from PIL import ImageFile

    from masc_engine.errors import InputError
    from masc_engine.runtime.io import image_from_bytes, mask_from_bytes

    data = SRC_MASK.read_bytes()

    def broken(self):
        raise exc

    monkeypatch.setattr(ImageFile.ImageFile, "load", broken)
    for read, reason in ((image_from_bytes, "unreadable_image"), (mask_from_bytes, "unreadable_mask")):
        with pytest.raises(InputError) as e:
            read(data, "x.png")
        want = "image_too_large" if isinstance(exc, MemoryError) else reason
        assert e.value.reason == want and "x.png" in e.value.detail and "\n" not in str(e.value)


def test_hostile_files_cost_their_row_only(naflex_bundle, tmp_path, monkeypatch):
    """masc-run reads files through the same allowlist: a PostScript output image, a PDF mask and
    a DDS whose header crashes Pillow's decoder are their rows' statuses; the other rows score."""
    import io
    import struct

    record = _fake_gs(tmp_path, monkeypatch)
    shutil_copy = __import__("shutil").copy
    shutil_copy(SRC_IMG, tmp_path / "cat.jpg")
    shutil_copy(SRC_MASK, tmp_path / "cat.png")
    (tmp_path / "x.ps").write_bytes(b"%!PS-Adobe-3.0\nnewpath 0 0 moveto 9 9 lineto stroke showpage\n")
    b = io.BytesIO()
    Image.new("L", (8, 8)).save(b, "PDF")
    (tmp_path / "m.pdf").write_bytes(b.getvalue())
    b = io.BytesIO()
    Image.new("RGB", (8, 8)).save(b, "DDS")
    dds = bytearray(b.getvalue())
    struct.pack_into("<I", dds, 4 + 76, 0)  # DDS_HEADER.ddspf.dwFlags = 0: Pillow raises NotImplementedError
    (tmp_path / "x.dds").write_bytes(bytes(dds))
    path = tmp_path / "pairs.csv"
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["key", "ref_image", "ref_mask", "out_image", "out_mask", "prompt", "object_name"])
        w.writerow(["ok1", "cat.jpg", "cat.png", "cat.jpg", "cat.png", "a cat", "cat"])
        w.writerow(["ps", "cat.jpg", "cat.png", "x.ps", "cat.png", "a cat", "cat"])
        w.writerow(["pdf", "cat.jpg", "m.pdf", "cat.jpg", "cat.png", "a cat", "cat"])
        w.writerow(["dds", "x.dds", "cat.png", "cat.jpg", "cat.png", "a cat", "cat"])
        w.writerow(["ok2", "cat.jpg", "cat.png", "cat.jpg", "cat.png", "a cat", "cat"])
    out = tmp_path / "o.csv"
    run_pairs(path, Scorer(naflex_bundle), out, options=RunOptions(progress=False))
    status = {r["key"]: r["status"] for r in read_output(out)}
    assert status == {
        "ok1": "ok",
        "ps": "unreadable_image",
        "pdf": "unreadable_mask",
        "dds": "unreadable_image",
        "ok2": "ok",
    }
    assert not record.exists()
