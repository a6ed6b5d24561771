"""Shared fixtures: tiny random-weight bundles (exported once per session) and the oracle.

The oracle is masc-metric 0.3.0 (import ``masc``) on the same random-weight checkpoint
directory the bundle was exported from. Tests needing torch/transformers/masc skip with a reason
when those are missing (a runtime-only install); CI installs them (see .ci/run).
"""

from __future__ import annotations

import csv
import json
import os
import warnings
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data" / "dreambooth"
EXAMPLES = REPO / "examples" / "dreambooth"


def pytest_configure(config):
    warnings.filterwarnings("ignore", message=".*random weights.*")


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


@pytest.fixture(scope="session", params=photo_sets())
def photo_dir(request) -> Path:
    """A real-photo set folder (``pairs.csv``, ``gallery.csv``, ``images/``, ``masks/``)."""
    return request.param


def read_rows(folder: Path, name: str = "pairs.csv") -> list[dict]:
    with open(folder / name, newline="", encoding="utf-8-sig") as f:
        return list(csv.DictReader(f))


def load_pair(folder: Path, row: dict):
    """(ref_image, ref_mask, out_image, out_mask, prompt, object_name) as the reference reads them."""
    return (Image.open(folder / row["ref_image"]), np.array(Image.open(folder / row["ref_mask"]).convert("L")),
            Image.open(folder / row["out_image"]), np.array(Image.open(folder / row["out_mask"]).convert("L")),
            row["prompt"], row["object_name"])


#: Pillow's decompression-bomb limit when the tests start (its default).
_PILLOW_MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS


@pytest.fixture(autouse=True)
def _pillow_pixel_limit():
    """Pillow's decompression-bomb limit is process-wide and masc-serve's ``create_app`` sets it
    (``--max-pixels``): a test that builds the app in-process (a module-scoped app included) must
    not change it for the tests after it (masc-report's pixel limit and masc-run's default file
    cap are read from it)."""
    yield
    Image.MAX_IMAGE_PIXELS = _PILLOW_MAX_IMAGE_PIXELS  # Pillow's default, as the process started


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    # Random checkpoints are cached per session unless MASC_ENGINE_CACHE points elsewhere.
    d = Path(os.environ.get("MASC_ENGINE_CACHE") or tmp_path_factory.mktemp("masc-cache"))
    os.environ["MASC_ENGINE_CACHE"] = str(d)
    return d


def _export(kind: str, tmp_path_factory, cache_dir, precision: str = "fp32") -> Path:
    pytest.importorskip("torch", reason="exporting a test bundle needs the export extra (torch)")
    pytest.importorskip("transformers", reason="exporting a test bundle needs transformers")
    from masc_engine.export.exporter import export_bundle

    out = tmp_path_factory.mktemp(f"bundle-{kind}-{precision}")
    return export_bundle(f"random:tiny-{kind}", out, precision=precision)


@pytest.fixture(scope="session")
def naflex_bundle(tmp_path_factory, cache_dir) -> Path:
    return _export("naflex", tmp_path_factory, cache_dir)


@pytest.fixture(scope="session")
def fp16_bundle(tmp_path_factory, cache_dir) -> Path:
    """The tiny NaFlex model exported with ``--precision fp16`` (mixed-precision graphs)."""
    return _export("naflex", tmp_path_factory, cache_dir, precision="fp16")


@pytest.fixture(scope="session")
def fixed_bundle(tmp_path_factory, cache_dir) -> Path:
    return _export("fixed", tmp_path_factory, cache_dir)


@pytest.fixture(scope="session")
def base_bundle(tmp_path_factory, cache_dir) -> Path:
    """A base-shaped random-weight NaFlex bundle (SigLIP2-base sizes: 12 layers, D = 768) at a
    patch budget of 256, exported once per session without the post-export validation (tested on
    the tiny models; here only the shapes matter): the user shape for batch-invariance checks."""
    pytest.importorskip("torch", reason="exporting a test bundle needs the export extra (torch)")
    from masc_engine.export.exporter import export_bundle

    out = tmp_path_factory.mktemp("bundle-base")
    return export_bundle("random:base-naflex", out, max_num_patches=256, validate=False)


@pytest.fixture(scope="session")
def seg_bundle(tmp_path_factory, cache_dir) -> Path:
    """A random-weight segmenter bundle: ``masc-export --model random:clipseg-tiny --out B``,
    through the command line (tests/test_segmenter.py, tests/test_segmenter_jobs.py)."""
    pytest.importorskip("torch", reason="exporting a segmenter bundle needs the export extra (torch)")
    pytest.importorskip("transformers", reason="exporting a segmenter bundle needs transformers")
    from click.testing import CliRunner

    from masc_engine.cli.export_cmd import main

    out = tmp_path_factory.mktemp("segmenter") / "clipseg"
    res = CliRunner().invoke(main, ["--model", "random:clipseg-tiny", "--out", str(out)])
    assert res.exit_code == 0, res.output
    return out


@pytest.fixture(scope="session")
def reference_model(seg_bundle):
    """transformers' ``CLIPSegForImageSegmentation`` and processor of the segmenter bundle's
    random checkpoint (the reference of the mask recipe, export/segmenter_reference.py)."""
    from masc_engine.export.segmenter import load_segmenter

    model, processor, _ = load_segmenter("random:clipseg-tiny")
    return model, processor


@pytest.fixture(scope="session", params=["naflex", "fixed"])
def any_bundle(request) -> Path:
    return request.getfixturevalue(f"{request.param}_bundle")


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


class ArrayCPRunner:
    """The ``cp`` graph's arithmetic (runtime/heads.py ``cp_forward``) as a runner of the ``cp``
    graph, over an array module (numpy here, CuPy on a GPU): what ``GraphCP`` packs pairs for.
    ``run`` returns numpy arrays; ``run_device`` the module's (on the GPU with CuPy)."""

    name = "cp"
    input_names = ["ref_tokens", "ref_keep", "out_tokens", "out_valid"]
    output_names = ["cp", "best", "n_keep"]

    def __init__(self, xp=np, gemm_dtype: str = "float32"):
        self.xp, self.gemm_dtype = xp, gemm_dtype

    def run_device(self, feeds: dict, device=None) -> dict:
        from masc_engine.runtime.heads import cp_forward

        return cp_forward(*(self.xp.asarray(feeds[k]) for k in self.input_names), xp=self.xp,
                          gemm_dtype=self.gemm_dtype)

    def run(self, feeds: dict) -> dict:
        to_host = getattr(self.xp, "asnumpy", np.asarray)
        return {k: to_host(v) for k, v in self.run_device(feeds).items()}


def with_baselines(scorer, items, **kw):
    """``scorer.score_encoded(items)`` with the ``--baselines`` metrics' values in each extras."""
    from masc_engine.runtime import pair_metrics as pm

    res = scorer.score_encoded(items, **kw)
    batch = pm.MetricBatch(items, res, pm.HostTokens(scorer.host_encoding), scorer.fg_threshold, scorer=scorer)
    for r, vals in zip(res, pm.compute_all(pm.metrics_for({"baselines"}), batch)):
        r.extras.update(vals)
    return res
