"""What the tests share apart from fixtures: paths, the real-photo sets, pair readers as the
reference reads them, synthetic images and masks, the oracle (masc-metric 0.3.0) per bundle.

Importable from any test (``from support import EXAMPLES, read_rows``): the tests folder is on
``sys.path`` under pytest's rootdir rules; bench scripts add it themselves.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared" / "data" / "dreambooth"
EXAMPLES = REPO / "examples" / "dreambooth"


def photo_sets() -> list:
    """The real-photo sets a test runs on: the shipped examples always, the shared set when present.

    ``examples/dreambooth/`` travels with every clone, so a fresh clone runs every real-photo check
    on it (nothing skips for want of data). The project's shared set (158 pairs, beside a checkout
    at ``../shared/data/dreambooth``) is an extra, larger run, added as a second parameter only
    where it exists: absent, it is not collected (not a skip).
    """
    sets = [pytest.param(EXAMPLES, id="examples")]
    if (SHARED / "pairs.csv").is_file():
        sets.append(pytest.param(SHARED, id="shared"))
    return sets


def read_rows(folder: Path, name: str = "pairs.csv") -> list[dict]:
    with open(folder / name, newline="", encoding="utf-8-sig") as f:
        return list(csv.DictReader(f))


def load_pair(folder: Path, row: dict):
    """(ref_image, ref_mask, out_image, out_mask, prompt, object_name) as the reference reads them."""
    return (
        Image.open(folder / row["ref_image"]),
        np.array(Image.open(folder / row["ref_mask"]).convert("L")),
        Image.open(folder / row["out_image"]),
        np.array(Image.open(folder / row["out_mask"]).convert("L")),
        row["prompt"],
        row["object_name"],
    )


#: Pillow's decompression-bomb limit when the tests start (its default).


def checkpoint_dir(bundle: Path) -> str:
    return json.loads((bundle / "manifest.json").read_text())["source"]["checkpoint_dir"]


_ORACLES: dict = {}


def oracle_for(bundle: Path, **kwargs):
    """masc-metric 0.3.0 on the bundle's source checkpoint (cached per settings)."""
    pytest.importorskip("masc", reason="the oracle masc-metric 0.3.0 is not installed")
    from masc import MaSC

    key = (str(bundle), tuple(sorted(kwargs.items())))
    if key not in _ORACLES:
        _ORACLES[key] = MaSC(model_id=checkpoint_dir(bundle), device="cpu", **kwargs)
    return _ORACLES[key]


def grid_image(grid: tuple[int, int], patch: int = 16, seed: int = 0) -> Image.Image:
    """A structured RGB image of exactly grid * patch pixels (so NaFlex picks that grid)."""
    from masc_engine.export.validate import synthetic_image

    return synthetic_image(grid[0] * patch, grid[1] * patch, seed)


def blob_mask(height: int, width: int, seed: int = 0, frac: float = 0.35) -> np.ndarray:
    """uint8 0/255 elliptical foreground mask covering about ``frac`` of the image."""
    rng = np.random.default_rng(seed)
    cy, cx = rng.uniform(0.35, 0.65) * height, rng.uniform(0.35, 0.65) * width
    ry, rx = np.sqrt(frac / np.pi) * height * 1.1, np.sqrt(frac / np.pi) * width * 0.9
    yy, xx = np.mgrid[0:height, 0:width]
    return ((((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2) <= 1).astype(np.uint8) * 255


def with_baselines(scorer, items, **kw):
    """``scorer.score_encoded(items)`` with the ``--baselines`` metrics' values in each extras."""
    from masc_engine.runtime import pair_metrics as pm

    res = scorer.score_encoded(items, **kw)
    batch = pm.MetricBatch(items, res, pm.HostTokens(scorer.host_encoding), scorer.fg_threshold, scorer=scorer)
    for r, vals in zip(res, pm.compute_all(pm.metrics_for({"baselines"}), batch)):
        r.extras.update(vals)
    return res


def run_shared_dir(tmp_path_factory) -> Path:
    """The temporary folder every process of one test run shares.

    Under pytest-xdist each worker has its own base temporary folder (``.../pytest-N/popen-gw0``);
    their parent is the run's (the pattern pytest-xdist documents for session fixtures built once).
    Without xdist it is the run's own base temporary folder.
    """
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def build_once(tmp_path_factory, name: str, build) -> Path:
    """``build(folder) -> Path`` run once per test run, whatever the number of xdist workers.

    The first worker to ask builds under a file lock into ``<run shared dir>/once/<name>/`` and
    records the returned path; the others wait on the lock and get that path. A build that raises
    records nothing (the next worker tries again and meets the same error or skip).
    """
    from filelock import FileLock

    root = run_shared_dir(tmp_path_factory) / "once"
    root.mkdir(exist_ok=True)
    with FileLock(str(root / f"{name}.lock")):
        done = root / f"{name}.done"
        if done.is_file():
            return Path(done.read_text(encoding="utf-8"))
        folder = root / name
        folder.mkdir(exist_ok=True)
        out = Path(build(folder))
        done.write_text(str(out), encoding="utf-8")
        return out


def export_tiny(kind: str, tmp_path_factory, cache_dir, precision: str = "fp32", graphs_of: Path | None = None) -> Path:
    """``random:tiny-<kind>`` exported at ``precision`` once per test run (every xdist worker
    shares it, :func:`build_once`); skips without the export extra. ``cache_dir`` is the run's
    random-checkpoint cache (asked for so that it is set first). ``graphs_of``: an fp32 bundle of
    the same checkpoint whose graphs the export copies instead of tracing them again
    (tests/doubles ``graphs_from``)."""
    pytest.importorskip("torch", reason="exporting a test bundle needs the export extra (torch)")
    pytest.importorskip("transformers", reason="exporting a test bundle needs transformers")
    from doubles.exported_graphs import graphs_from
    from masc_engine.export.exporter import export_bundle

    def build(out: Path) -> Path:
        with graphs_from(graphs_of) if graphs_of else contextlib.nullcontext():
            return export_bundle(f"random:tiny-{kind}", out, precision=precision)

    return build_once(tmp_path_factory, f"bundle-{kind}-{precision}", build)


class CommandExport:
    """``masc-export --model random:tiny-naflex --out <folder>/naflex`` run once per test run as a
    user runs it (a child process, the command line's own entry point): the bundle, everything the
    command printed (stdout and stderr, in order), its exit status and whether the command's process
    ever imported torch or transformers (printed by the child once the command ended). Tests of the
    command's own output read it instead of exporting again."""

    #: What the child prints after the command: whether torch and transformers were imported.
    IMPORTS = "torch imported:"

    def __init__(self, folder: Path) -> None:
        self.bundle = folder / "naflex"
        self.log = folder / "naflex.export.log"  # the command's library log, beside --out
        self.output = (folder / "command.out").read_text(encoding="utf-8")
        self.returncode = int((folder / "command.rc").read_text(encoding="utf-8"))

    @classmethod
    def run(cls, folder: Path) -> Path:
        """Run the command into ``folder`` (:func:`build_once`'s builder); returns the bundle."""
        import subprocess
        import sys

        code = (
            "import sys\n"
            "from masc_engine.cli.export_cmd import main\n"
            "rc = 0\n"
            "try:\n"
            f"    main(['--model', 'random:tiny-naflex', '--out', {str(folder / 'naflex')!r}])\n"
            "except SystemExit as e:\n"
            "    rc = e.code or 0\n"
            f"print({cls.IMPORTS!r}, 'torch' in sys.modules, 'transformers' in sys.modules, flush=True)\n"
            "sys.exit(rc)\n"
        )
        res = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        (folder / "command.out").write_text(res.stdout, encoding="utf-8")
        (folder / "command.rc").write_text(str(res.returncode), encoding="utf-8")
        assert res.returncode == 0, res.stdout[-3000:]
        return folder / "naflex"


def export_by_command(tmp_path_factory) -> CommandExport:
    """The run's :class:`CommandExport` (built on first use; skips without the export extra)."""
    pytest.importorskip("torch", reason="exporting a test bundle needs the export extra (torch)")
    pytest.importorskip("transformers", reason="exporting a test bundle needs transformers")
    return CommandExport(build_once(tmp_path_factory, "command-export-naflex", CommandExport.run).parent)


class EmbedderBundles:
    """Random-weight embedder bundles by preset name (``export/random_models.py``
    ``EMBEDDER_PRESETS``: ``clip-tiny``, ``dino-tiny-s16``, ``clip-tiny-l14``...), each exported
    (fp32, validated) on first use and kept: one export per preset per test run, whatever the
    number of xdist workers (:func:`build_once`; conftest's session fixture ``embedder_bundles``).

    Indexing skips the test without the export extra (torch, transformers).
    """

    def __init__(self, tmp_path_factory) -> None:
        self._factory = tmp_path_factory
        self._bundles: dict[str, Path] = {}

    def __getitem__(self, preset: str) -> Path:
        if preset not in self._bundles:
            pytest.importorskip("torch", reason="exporting an embedder bundle needs the export extra (torch)")
            pytest.importorskip("transformers", reason="exporting an embedder bundle needs transformers")
            from masc_engine.export.embedders import export_embedder_bundle

            def build(folder: Path) -> Path:
                return export_embedder_bundle(f"random:{preset}", folder / "bundle")

            self._bundles[preset] = build_once(self._factory, f"embedder-{preset}", build)
        return self._bundles[preset]
