"""Workload generators shared by the benchmark scripts (and tests/test_precision.py).

Two kinds of pairs, both written as a masc-run pairs CSV:

- :func:`dreambench_pairs`: DreamBench-shaped, per subject photo ``00`` as the reference against
  unique outputs (other photos of the subject, mirrored, cropped and colour-shifted per prompt and
  method, so no output image repeats and deduplication cannot help);
- :func:`odd_size_pairs`: existing pairs with every image and its mask cropped and resized to odd
  sizes (off the traced shapes, patch grids that do not divide evenly).
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import time
from pathlib import Path

#: The prompts of the DreamBench-shaped workloads (``{}`` is the subject's class).
PROMPTS = [
    "a {} in the jungle",
    "a {} on the beach",
    "a {} with a city in the background",
    "a {} floating on top of water",
    "a red {}",
    "a {} in the snow",
]

#: ``(width, height)`` of the odd-sized copies, cycled over pairs and over reference/output.
ODD_SIZES = [(333, 517), (517, 333), (401, 299), (257, 263), (480, 271), (199, 601)]


def write_pairs_csv(path: Path, rows: list[dict]) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path


def dreambench_pairs(
    work: Path,
    photo_root: Path,
    subjects: list[tuple[str, str]],
    prompts: int = len(PROMPTS),
    methods: int = 2,
    relative_outputs: bool = False,
) -> Path:
    """``work/pairs.csv``: ``len(subjects) * prompts * methods`` pairs, outputs in ``work/outputs``.

    Args:
        photo_root: a folder with ``images/<subject>/*.jpg`` and ``masks/<subject>/*.png``
            (``examples/dreambooth`` or the shared set).
        subjects: ``(subject folder, class noun)`` pairs.
        prompts: how many of :data:`PROMPTS` (cycled past six).
        relative_outputs: output paths relative to ``work`` (else absolute).
    """
    from PIL import Image, ImageEnhance, ImageOps

    out_dir = work / "outputs"
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, cls in subjects:
        photos = sorted((photo_root / "images" / name).glob("*.jpg"))[1:]
        for p in range(prompts):
            for m in range(methods):
                k = p * methods + m
                src = photos[k % len(photos)]
                im = Image.open(src).convert("RGB")
                mask = Image.open(photo_root / "masks" / name / (src.stem + ".png")).convert("L")
                if k % 2:
                    im, mask = ImageOps.mirror(im), ImageOps.mirror(mask)
                w, h = im.size
                c = 4 + 6 * (k % 5)
                box = (c, c // 2, w - c // 2, h - c)
                im, mask = im.crop(box), mask.crop(box)
                im = ImageEnhance.Color(im).enhance(0.8 + 0.1 * (k % 4))
                stem = f"{name}_p{p}_m{m}"
                im.save(out_dir / f"{stem}.jpg", quality=92)
                mask.save(out_dir / f"{stem}.png")
                out = f"outputs/{stem}" if relative_outputs else str(out_dir / stem)
                rows.append(
                    {
                        "key": stem,
                        "subject": name,
                        "method": f"method{m}",
                        "ref_image": str(photo_root / "images" / name / "00.jpg"),
                        "ref_mask": str(photo_root / "masks" / name / "00.png"),
                        "out_image": out + ".jpg",
                        "out_mask": out + ".png",
                        "prompt": PROMPTS[p % len(PROMPTS)].format(cls),
                        "object_name": cls,
                    }
                )
    return write_pairs_csv(work / "pairs.csv", rows)


def odd_size_pairs(rows: list[dict], base: Path, out_dir: Path) -> tuple[Path, list[dict]]:
    """``out_dir/pairs.csv``: ``rows`` (a pairs CSV's rows, paths relative to ``base``) with every
    image and mask cropped by a few pixels and resized to an :data:`ODD_SIZES` size (bicubic
    images, nearest masks). Returns the CSV and its rows."""
    from PIL import Image

    out_rows = []
    for i, r in enumerate(rows):
        row = dict(r)
        for j, (ic, mc) in enumerate((("ref_image", "ref_mask"), ("out_image", "out_mask"))):
            w, h = ODD_SIZES[(i + j) % len(ODD_SIZES)]
            img, mask = Image.open(base / r[ic]).convert("RGB"), Image.open(base / r[mc]).convert("L")
            box = (7, 3, img.width - 5, img.height - 11)
            stem = f"{i:03d}_{j}"
            img.crop(box).resize((w, h), Image.BICUBIC).save(out_dir / f"{stem}.png")
            mask.crop(box).resize((w, h), Image.NEAREST).save(out_dir / f"{stem}_mask.png")
            row[ic], row[mc] = f"{stem}.png", f"{stem}_mask.png"
        out_rows.append(row)
    return write_pairs_csv(out_dir / "pairs.csv", out_rows), out_rows


def run_child(module: str, fn: str, *args) -> tuple[object, float]:
    """``fn(*args)`` of the bench script ``module`` in a fresh Python process (cold: imports, model
    loads and first calls all counted); returns (its JSON result, wall seconds spawn -> exit)."""
    bench = str(Path(__file__).resolve().parent)
    code = (
        f"import json, sys; sys.path.insert(0, {bench!r}); import {module} as b; "
        f"print('RESULT' + json.dumps(b.{fn}(*{args!r}), default=float))"
    )
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    wall = time.perf_counter() - t
    if out.returncode:
        raise RuntimeError(f"{module}.{fn} failed:\n{out.stderr[-4000:]}")
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT")][-1]
    return json.loads(line[len("RESULT") :]), wall
