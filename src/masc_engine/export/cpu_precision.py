"""bf16 on the CPU, certified: OpenVINO bf16 scores gated against fp32, mixed per layer if needed.

A ``bf16-cpu`` bundle is an fp32 bundle (graphs unchanged, still oracle-equal on ONNX Runtime) plus
a certificate in ``manifest["precision"]``: OpenVINO's CPU plugin may run its ``graphs`` in bf16,
keeping the units in ``keep_fp32`` in fp32 (engine/backends/openvino.py runs it so). The
certificate is earned here, at export:

1. **Pairs.** Calibration pairs (default: the shipped examples ``examples/dreambooth`` in a
   checkout, plus a generated grid of synthetic images of varied sizes and patch grids) choose the
   precision plan; held-out pairs (default: DreamBench-shaped copies of the shipped photos, cropped,
   mirrored, colour-shifted and resized to odd sizes, plus another synthetic grid, at least
   ``tolerances.FIDELITY_MIN_PAIRS`` pairs) confirm it. A user's pairs CSV can replace either.
2. **Reference.** Both sets are scored in fp32 by ONNX Runtime on the same bundle (what masc-run
   runs by default).
3. **Gates** (:func:`gate_figures`: :mod:`masc_engine.metrics.certification` with the
   reduced-precision gates of :mod:`masc_engine.tolerances`):
   per pair |dCP| and |dPF| <= ``FIDELITY_MAX_ABS_DELTA``, Spearman of CP and of PF >=
   ``FIDELITY_MIN_SPEARMAN``, no NaN where fp32 is finite (nor the reverse), and on the held-out set
   at least ``FIDELITY_MIN_PAIRS`` pairs.
4. **Search** (:func:`search_keep_list`). The whole graph in bf16 first. If it fails on the
   calibration pairs: each unit's sensitivity is measured by keeping it alone in fp32 (the gate
   load, :func:`gate_load`, with that unit in fp32), units are sorted by it (most helpful first),
   and kept in fp32 one more at a time until the calibration gates pass. Then the held-out gates;
   if they fail, the next unit is kept, and so on. Greedy by single-unit sensitivity: not
   guaranteed the smallest set, but each added unit is the one that helped most alone. More than
   ``max_keep`` units (default half the graph's units) is a refusal: bf16 would then buy little.
5. **Certificate** (:func:`certificate_record`) or :class:`CertificationError` with the figures.

Units of a graph (:func:`graph_units`): ``<graph>.embeddings``, ``<graph>.layers.<i>`` (one
pre-LayerNorm encoder layer) and ``<graph>.head`` (the final LayerNorm, plus the text tower's
projection), cut at the residual stream: the first input of each layer's first LayerNormalization
and of the final one. Only the vision graph is certified by default: it is most of a pair's
compute; the text graph runs once per distinct prompt and the pooling head once per output image.
"""

from __future__ import annotations

import ast
import copy
import csv
import gc
import logging
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
from PIL import Image, ImageEnhance, ImageOps

from ..engine.backends.openvino import BF16_CPU_MODE, check_available
from ..errors import ExportValidationError, InputError
from ..metrics.certification import FIDELITY_GATES, certify, gate_load
from ..metrics.ranked import spearman_rho as spearman  # noqa: F401  (the gates' Spearman's rho, importable from here)
from ..tolerances import FIDELITY_MAX_ABS_DELTA, FIDELITY_MIN_PAIRS, FIDELITY_MIN_SPEARMAN

logger = logging.getLogger(__name__)

#: ``masc-export --precision bf16-cpu``.
BF16_CPU = BF16_CPU_MODE
#: Graphs run in bf16 by default (the vision tower: most of a pair's FLOPs).
DEFAULT_GRAPHS = ("vision",)
#: The shipped example photos (in a checkout; an installed package has no ``examples/``).
EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "dreambooth"
#: Most rows read from a user's pairs CSV (each row is two images to encode per configuration).
MAX_CSV_PAIRS = 20000
#: DreamBench-style prompts (``{}`` is the subject's class), as bench/workloads.py's.
PROMPTS = (
    "a {} in the jungle",
    "a {} on the beach",
    "a {} with a city in the background",
    "a {} floating on top of water",
    "a red {}",
    "a {} in the snow",
)


class CertificationError(ExportValidationError):
    """The bf16 configuration fails its gates (or needs more fp32 units than allowed); ``report``
    holds every figure measured."""


# --------------------------------------------------------------------------- units of a graph


def graph_units(onnx_path: str | Path, graph: str) -> dict:
    """The unit table of a pre-LayerNorm transformer graph (vision or text tower).

    Returns:
        ``{"names": [graph.embeddings, graph.layers.0 .. graph.layers.L-1, graph.head],
        "boundaries": [L + 1 tensor names]}``: boundary ``i < L`` is layer ``i``'s input (the first
        input of its first LayerNormalization), boundary ``L`` the final LayerNorm's input.

    Raises:
        CertificationError: the graph is not ``2 L + 1`` LayerNormalization nodes in order, or the
            exporter's scope metadata (``pkg.torch.onnx.name_scopes``) places them in other layers.
    """
    import onnx

    model = onnx.load(str(onnx_path), load_external_data=False)
    lns = [n for n in model.graph.node if n.op_type == "LayerNormalization"]
    if len(lns) % 2 == 0 and lns and _scopes(lns[0]) and not _in_layer(lns[0], 0):
        # CLIP's vision tower normalises the embeddings before the encoder (``pre_layrnorm``): that
        # LayerNorm is part of the embeddings unit, not a layer's.
        lns = lns[1:]
    if len(lns) < 3 or len(lns) % 2 != 1:
        raise CertificationError(
            f"graph {graph!r} has {len(lns)} LayerNormalization nodes; per-layer precision "
            "needs a pre-LayerNorm encoder (2 per layer + a final one)"
        )
    n_layers = (len(lns) - 1) // 2
    for i in range(n_layers):
        for node in lns[2 * i : 2 * i + 2]:
            if _scopes(node) and not _in_layer(node, i):
                raise CertificationError(
                    f"graph {graph!r}: LayerNormalization {node.name} is not in encoder layer {i} "
                    f"(scopes {_scopes(node)[:4]})"
                )
    bounds = [lns[2 * i].input[0] for i in range(n_layers)] + [lns[-1].input[0]]
    names = [f"{graph}.embeddings"] + [f"{graph}.layers.{i}" for i in range(n_layers)] + [f"{graph}.head"]
    return {"names": names, "boundaries": bounds}


def _scopes(node) -> list[str]:
    """The module scopes torch's exporter recorded on ``node`` (``pkg.torch.onnx.name_scopes``)."""
    meta = {p.key: p.value for p in node.metadata_props}
    return list(ast.literal_eval(meta.get("pkg.torch.onnx.name_scopes", "[]")))


def _in_layer(node, i: int) -> bool:
    """Whether ``node`` sits in encoder layer ``i`` (a scope ending ``layers.<i>``, or ``layer.<i>``
    as transformers' ViT and DINOv2 name theirs)."""
    return any(s.endswith((f"layers.{i}", f"layer.{i}")) for s in _scopes(node))


# --------------------------------------------------------------------------- pairs


def _ellipse_mask(h: int, w: int, rng) -> np.ndarray:
    cy, cx = rng.uniform(0.35, 0.65) * h, rng.uniform(0.35, 0.65) * w
    ry, rx = rng.uniform(0.22, 0.4) * h, rng.uniform(0.2, 0.38) * w
    yy, xx = np.mgrid[0:h, 0:w]
    return ((((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2) <= 1).astype(np.uint8) * 255


#: ``(height, width)`` of the synthetic grid images: square, tall, wide, tiny, odd (NaFlex grids that
#: do not divide evenly).
GRID_SIZES = (
    (224, 288),
    (480, 160),
    (333, 517),
    (512, 512),
    (97, 203),
    (640, 427),
    (300, 301),
    (181, 777),
    (256, 256),
    (517, 333),
    (401, 299),
    (199, 601),
)
GRID_CLASSES = ("dog", "backpack", "cat", "teapot", "sneaker", "vase")


def synthetic_images(n: int, seed: int) -> list[tuple[Image.Image, np.ndarray, str]]:
    """``n`` synthetic ``(image, mask, class)`` triples (export/validate.py ``synthetic_image``:
    gradients, a checkerboard and noise), sizes cycling :data:`GRID_SIZES`, elliptic masks."""
    from .validate import synthetic_image

    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        h, w = GRID_SIZES[(i + seed) % len(GRID_SIZES)]
        out.append(
            (synthetic_image(h, w, seed * 1000 + i), _ellipse_mask(h, w, rng), GRID_CLASSES[i % len(GRID_CLASSES)])
        )
    return out


def cross_pairs(items: Sequence[tuple[Image.Image, np.ndarray, str]], refs_per_output: int, offset: int = 1) -> list:
    """Pairs among ``items``: each one as the output against ``refs_per_output`` others as
    references (a rotation), the prompt naming the output's class. Each image is encoded once
    whatever the number of pairs (``Scorer.score_batch`` deduplicates image objects)."""
    from ..runtime.scorer import Pair

    n = len(items)
    pairs = []
    for o, (out, out_mask, cls) in enumerate(items):
        others = [j % n for j in range(o + offset, o + offset + n) if j % n != o][:refs_per_output]
        for k, r in enumerate(others):
            ref, ref_mask, _ = items[r]
            pairs.append(Pair(ref, ref_mask, out, out_mask, PROMPTS[(o + k) % len(PROMPTS)].format(cls), cls))
    return pairs


def _photos(examples: Path) -> list[tuple[Path, Path, str]]:
    """``(image, mask, class)`` of every shipped photo (class = the subject folder, digits dropped)."""
    out = []
    for d in sorted((examples / "images").iterdir()):
        for img in sorted(d.glob("*.jpg")):
            out.append((img, examples / "masks" / d.name / (img.stem + ".png"), d.name.rstrip("0123456789")))
    return out


def example_pairs(examples: Path = EXAMPLES) -> list:
    """The shipped examples: their ``pairs.csv`` (same-subject pairs: the narrow score range) plus
    every photo as an output against 3 photos of other subjects (wide range). Empty when absent."""
    from ..runtime.io import load_image, load_mask

    if not (examples / "pairs.csv").is_file():
        return []
    pairs = read_pairs_csv(examples / "pairs.csv")
    items = [(load_image(str(i)), load_mask(str(m)), c) for i, m, c in _photos(examples)]
    return pairs + cross_pairs(items, 3, offset=5)


def dreambench_copies(examples: Path = EXAMPLES) -> list[tuple[Image.Image, np.ndarray, str]]:
    """Each shipped photo cropped, mirrored (every other one), colour-shifted and resized to an odd
    size, with its mask (DreamBench-shaped outputs, as bench/workloads.py makes them)."""
    from ..runtime.io import load_image, load_mask

    if not (examples / "images").is_dir():
        return []
    sizes = ((333, 517), (517, 333), (401, 299), (257, 263), (480, 271), (199, 601))
    out = []
    for k, (img_path, mask_path, cls) in enumerate(_photos(examples)):
        im, mask = load_image(str(img_path)), Image.fromarray(load_mask(str(mask_path)))
        if k % 2:
            im, mask = ImageOps.mirror(im), ImageOps.mirror(mask)
        c = 4 + 6 * (k % 5)
        box = (c, c // 2, im.width - c // 2, im.height - c)
        w, h = sizes[k % len(sizes)]
        im = ImageEnhance.Color(im.crop(box)).enhance(0.8 + 0.1 * (k % 4)).resize((w, h), Image.Resampling.BICUBIC)
        out.append((im, np.asarray(mask.crop(box).resize((w, h), Image.Resampling.NEAREST)), cls))
    return out


def default_calibration(examples: Path = EXAMPLES, grid: int = 12) -> tuple[list, dict]:
    """The default calibration pairs and their description: the shipped examples (when present)
    plus a synthetic grid of ``grid`` images, each against 6 others."""
    ex = example_pairs(examples)
    syn = cross_pairs(synthetic_images(grid, seed=11), 6)
    return ex + syn, {
        "source": "examples+grid" if ex else "grid (no examples/ beside the package)",
        "example_pairs": len(ex),
        "grid_pairs": len(syn),
    }


def default_heldout(examples: Path = EXAMPLES, min_pairs: int = FIDELITY_MIN_PAIRS) -> tuple[list, dict]:
    """The default held-out pairs: DreamBench-shaped copies of the shipped photos plus a synthetic
    grid (other seeds than calibration), every image against enough others for ``min_pairs``."""
    copies = dreambench_copies(examples)
    need = next(n for n in range(2, 10**6) if n * (n - 1) >= min_pairs)  # images for min_pairs distinct pairs
    items = copies + synthetic_images(max(18, need - len(copies)), seed=29)
    per = -(-min_pairs // len(items))
    pairs = cross_pairs(items, per, offset=3)
    return pairs, {
        "source": "dreambench copies+grid" if copies else "grid (no examples/ beside the package)",
        "images": len(items),
        "pairs": len(pairs),
    }


def read_pairs_csv(path: str | Path, max_pairs: int = MAX_CSV_PAIRS) -> list:
    """A pairs CSV (masc-run's columns ``ref_image, ref_mask, out_image, out_mask, prompt,
    object_name``; paths relative to the file's folder) as :class:`~masc_engine.runtime.scorer.Pair`
    s, each distinct file loaded once.

    Raises:
        InputError: a missing column, more than ``max_pairs`` rows, an unreadable image or mask.
    """
    from ..runtime.io import load_image, load_mask
    from ..runtime.scorer import Pair

    path = Path(path)
    with open(path, newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        need = {"ref_image", "ref_mask", "out_image", "out_mask", "prompt"}
        missing = need - set(reader.fieldnames or ())
        if missing:
            raise InputError("bad_pairs_file", f"{path}: missing columns {sorted(missing)}")
        rows = []
        for row in reader:
            rows.append(row)
            if len(rows) > max_pairs:
                raise InputError("too_many_pairs", f"{path}: more than {max_pairs} pairs")
    loaded: dict[tuple[str, str], object] = {}

    def get(kind: str, name: str):
        if (kind, name) not in loaded:  # one object per file: each image is encoded once
            loaded[kind, name] = (load_image if kind == "image" else load_mask)(str(path.parent / name))
        return loaded[kind, name]

    return [
        Pair(
            get("image", r["ref_image"]),
            get("mask", r["ref_mask"]),
            get("image", r["out_image"]),
            get("mask", r["out_mask"]),
            r["prompt"],
            r.get("object_name") or None,
        )
        for r in rows
    ]


# --------------------------------------------------------------------------- gates


def gate_figures(ref: dict, test: dict, min_pairs: int = 0) -> dict:
    """The reduced-precision gates for paired scores: :func:`masc_engine.metrics.certification.certify`
    with :data:`~masc_engine.metrics.certification.FIDELITY_GATES` (tolerances.py thresholds).

    Args:
        ref, test: ``{"cp": [P], "pf": [P]}`` float arrays, same pairs in the same order (fp32
            reference, bf16 candidate). NaN is an undefined score (no kept reference patch, no
            background).
        min_pairs: the least number of pairs for the gates to count (``FIDELITY_MIN_PAIRS`` on
            held-out pairs; 0 on calibration pairs).

    Returns:
        The certification report: ``{"pass", "pairs", "gates": {name: {"value", "threshold",
        "margin", "pass"}}, "mean_abs_dcp", "mean_abs_dpf"`` and the flat figures and
        ``margins``}; gates ``max_abs_dcp``, ``max_abs_dpf``, ``spearman_cp``, ``spearman_pf``,
        ``finite_as_fp32`` (count of pairs finite on one side only) and ``min_pairs``.

    Raises:
        ValueError: the reference and candidate arrays differ in shape.
    """
    return certify(ref, test, FIDELITY_GATES, min_pairs)


def _summary(figures: dict) -> dict:
    g = figures["gates"]
    return {
        "pass": figures["pass"],
        "load": gate_load(figures),
        "pairs": figures["pairs"],
        "max_abs_dcp": g["max_abs_dcp"]["value"],
        "max_abs_dpf": g["max_abs_dpf"]["value"],
        "spearman_cp": g["spearman_cp"]["value"],
        "spearman_pf": g["spearman_pf"]["value"],
        "margins": {k: g[k]["margin"] for k in ("max_abs_dcp", "max_abs_dpf", "spearman_cp", "spearman_pf")},
    }


# --------------------------------------------------------------------------- scoring configurations


def scores(scorer, pairs: Sequence) -> dict:
    """``{"cp": [P], "pf": [P]}`` float64 arrays from ``scorer.score_batch(pairs)``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = scorer.score_batch(pairs)
    return {"cp": np.array([r.cp for r in res], np.float64), "pf": np.array([r.pf for r in res], np.float64)}


def certificate_record(units: dict, keep_fp32: Sequence[str], graphs: Sequence[str]) -> dict:
    """The ``manifest["precision"]`` record of a bf16-cpu configuration (before its gate figures):
    what engine/backends/openvino.py ``load_runner`` reads."""
    import openvino

    from ..engine.backends.openvino import core

    return {
        "mode": BF16_CPU,
        "backend": "openvino",
        "openvino": openvino.__version__,
        "cpu": str(core().get_property("CPU", "FULL_DEVICE_NAME")),
        "graphs": list(graphs),
        "units": {g: units[g] for g in graphs},
        "keep_fp32": list(keep_fp32),
        "graph_weights": "fp32",
    }


class CandidateScoring:
    """What every reduced-precision search scores with (bf16-cpu here, FP8 in export/fp8.py): the
    fp32 ONNX Runtime reference of a pair set, scored once, and a candidate scorer's figures
    against it. A subclass sets ``bundle``, ``threads``, ``unit_names`` (the searched units, in
    graph order), ``configurations = 0`` and ``_ref = {}`` and defines ``candidate_scores``."""

    bundle: Any
    threads: int | None
    unit_names: list[str]
    configurations: int
    _ref: dict[int, dict]

    def scores_of(self, scorer, pairs: Sequence) -> dict:
        """``{"cp": [P], "pf": [P]}`` of ``pairs`` by ``scorer`` (:func:`scores`)."""
        return scores(scorer, pairs)

    def reference_scorer(self):
        """The fp32 ONNX Runtime scorer of the bundle."""
        from ..runtime.scorer import Scorer

        return Scorer(self.bundle, intra_op_threads=self.threads)

    def reference(self, pairs: Sequence) -> dict:
        """fp32 ONNX Runtime scores of ``pairs`` (cached per pair list)."""
        if id(pairs) not in self._ref:
            self._ref[id(pairs)] = self.scores_of(self.reference_scorer(), pairs)
        return self._ref[id(pairs)]

    def score_candidate(self, scorer, pairs: Sequence) -> dict:
        """``scores_of(scorer, pairs)``, counted in ``configurations``; the scorer is released after."""
        try:
            self.configurations += 1
            return self.scores_of(scorer, pairs)
        finally:
            del scorer
            gc.collect()

    def candidate_scores(self, keep_fp32: Sequence[str], pairs: Sequence) -> dict:
        raise NotImplementedError

    def figures(self, keep_fp32: Sequence[str], pairs: Sequence, min_pairs: int = 0) -> dict:
        return gate_figures(self.reference(pairs), self.candidate_scores(keep_fp32, pairs), min_pairs)


class Evaluator(CandidateScoring):
    """Scores pair sets with candidate bf16 configurations of one fp32 bundle, against fp32 ONNX
    Runtime on the same bundle (the reference, scored once per set).

    A candidate runs exactly as masc-run would run the certified bundle: a copy of the loaded
    :class:`~masc_engine.engine.bundle.Bundle` whose manifest carries the candidate record, scored
    by ``Scorer(bundle, backend="openvino")`` (every graph on OpenVINO; the certified ones in bf16).
    """

    #: The bundle kind it certifies (engine/bundle.py).
    KIND = "scorer"

    def __init__(self, bundle_dir: str | Path, graphs: Sequence[str] = DEFAULT_GRAPHS, threads: int | None = None):
        from ..engine.bundle import Bundle

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.bundle = Bundle(bundle_dir, kind=self.KIND)
        self.graphs, self.threads = tuple(graphs), threads
        self.units = {g: graph_units(self.bundle.graph_file(g), g) for g in self.graphs}
        self.unit_names = [u for g in self.graphs for u in self.units[g]["names"]]
        self.configurations, self._ref = 0, {}

    def candidate(self, bundle):
        """What runs a candidate bundle: the scorer masc-run would make of it, on OpenVINO."""
        from ..runtime.scorer import Scorer

        return Scorer(bundle, backend="openvino", intra_op_threads=self.threads)

    def candidate_scores(self, keep_fp32: Sequence[str], pairs: Sequence) -> dict:
        """Scores of ``pairs`` with the graphs in bf16 except ``keep_fp32``."""
        b = copy.copy(self.bundle)  # shares the sha256 checks already done
        b.manifest = {**self.bundle.manifest, "precision": certificate_record(self.units, keep_fp32, self.graphs)}
        b.compiled_model_cache = False  # a candidate's compiled graphs are never imported again
        return self.score_candidate(self.candidate(b), pairs)


#: What an embedder bundle's certificate gates in the CP and PF slots of the gate report, the
#: classic metrics' own split (DreamBench++: CLIP-I and DINO measure concept preservation, CLIP-T
#: prompt following), as cosines (the metrics' columns are x100: a gate of 2e-3 is 0.2 points).
EMBEDDER_SCORES = {
    "cp": "cosine of the reference and output image embeddings (clip_i, dino, dino_s8, dinov2 / 100)",
    "pf": "cosine of the output image and prompt embeddings (clip_t / 100); an image-only embedder "
    "repeats the image cosine",
}


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosines of two ``[P, D]`` arrays, in float64."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    return np.sum(
        (a / np.linalg.norm(a, axis=1, keepdims=True)) * (b / np.linalg.norm(b, axis=1, keepdims=True)), axis=1
    )


def embedder_scores(embedder, pairs: Sequence) -> dict:
    """The :data:`EMBEDDER_SCORES` of ``pairs`` by an :class:`~masc_engine.runtime.embedder.Embedder`:
    ``{"cp": [P], "pf": [P]}`` float64 cosines in [-1, 1] (each distinct image object and prompt
    embedded once)."""
    images: dict[int, Image.Image] = {}
    for p in pairs:
        images.setdefault(id(p.ref_image), p.ref_image)
        images.setdefault(id(p.out_image), p.out_image)
    keys = list(images)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        emb = dict(zip(keys, embedder.embed_images([images[k] for k in keys])))
        prompts = sorted({p.prompt for p in pairs}) if embedder.has_text else []
        text = dict(zip(prompts, embedder.embed_texts(prompts))) if prompts else {}
    ref = np.stack([emb[id(p.ref_image)] for p in pairs])
    out = np.stack([emb[id(p.out_image)] for p in pairs])
    cp = _cosines(ref, out)
    if not text:
        return {"cp": cp, "pf": cp.copy()}
    return {"cp": cp, "pf": _cosines(out, np.stack([text[p.prompt] for p in pairs]))}


class EmbedderEvaluator(Evaluator):
    """:class:`Evaluator` for an embedder bundle (CLIP, DINO, DINOv2): the pairs' image-image and
    image-text cosines (:data:`EMBEDDER_SCORES`), fp32 ONNX Runtime against candidates run as
    masc-run runs a certified embedder (``Embedder`` on OpenVINO, the certified graphs in bf16)."""

    KIND = "embedder"

    def scores_of(self, scorer, pairs: Sequence) -> dict:
        return embedder_scores(scorer, pairs)

    def reference_scorer(self):
        from ..runtime.embedder import Embedder
        from ..runtime.encoder import RunnerSettings

        return Embedder(self.bundle, RunnerSettings(intra_op_threads=self.threads))

    def candidate(self, bundle):
        from ..runtime.embedder import Embedder
        from ..runtime.encoder import RunnerSettings

        return Embedder(bundle, RunnerSettings(backend="openvino", intra_op_threads=self.threads))


#: The graphs certified by default, per bundle kind (the image towers: most of the work).
DEFAULT_GRAPHS_BY_KIND = {"scorer": DEFAULT_GRAPHS, "embedder": ("image",)}
#: The graphs a certification may run in bf16, per bundle kind (``masc-export --bf16-graphs``): the
#: pre-LayerNorm towers :func:`graph_units` reads. The pooling head and the CP graph stay fp32.
CERTIFIABLE_GRAPHS_BY_KIND = {"scorer": ("vision", "text"), "embedder": ("image", "text")}


def _evaluator(bundle_dir: str | Path, graphs: Sequence[str] | None, threads: int | None) -> Evaluator:
    """The evaluator of the bundle's kind (a scorer or an embedder bundle; another kind is refused
    by the bundle reader, naming its option)."""
    from ..engine.manifest import read_manifest

    kind = read_manifest(bundle_dir).get("kind") or "scorer"
    graphs = tuple(graphs or DEFAULT_GRAPHS_BY_KIND.get(kind, DEFAULT_GRAPHS))
    return (EmbedderEvaluator if kind == "embedder" else Evaluator)(bundle_dir, graphs, threads)


def unit_sensitivity(ev: CandidateScoring, pairs: Sequence) -> dict[str, float]:
    """``{unit: gate load on pairs with that unit alone in fp32, the rest in bf16}``."""
    out = {}
    for u in ev.unit_names:
        out[u] = gate_load(ev.figures((u,), pairs))
        logger.info(f"  {u} alone in fp32: gate load {out[u]:.3f}")
    return out


def sensitivity_order(sensitivity: dict[str, float], names: Sequence[str]) -> list[str]:
    """Units most helpful in fp32 first (lowest gate load when kept alone), ties in graph order."""
    names = list(names)
    return sorted(names, key=lambda u: (sensitivity[u], names.index(u)))


def search_keep_list(
    ev: CandidateScoring, calibration: Sequence, heldout: Sequence, max_keep: int | None = None, mode: str = "bf16-cpu"
) -> dict:
    """The accuracy-aware search (module docstring, step 4).

    Args:
        mode: the reduced precision searched (``"bf16-cpu"`` or ``"fp8"``), named in the log
            lines and the refusal.

    Returns:
        ``{"keep_fp32", "calibration", "heldout"`` (figures of the chosen plan), ``"whole_graph"``,
        ``"sensitivity"`` ({unit: gate load with it alone in fp32}), ``"order"``,
        ``"trajectory"`` ([{keep count, calibration and held-out summaries}])}.

    Raises:
        CertificationError: no plan with at most ``max_keep`` fp32 units passes both sets.
    """
    names = ev.unit_names
    max_keep = min(len(names), len(names) // 2 if max_keep is None else int(max_keep))
    out: dict[str, Any] = {"trajectory": [], "sensitivity": {}, "order": []}
    cal = ev.figures((), calibration)
    out["whole_graph"] = _summary(cal)
    low = mode.removesuffix("-cpu")
    logger.info(f"{low} whole graph, calibration: {_fmt(cal)}")
    order: list[str] = []
    k = 0
    while True:
        step: dict[str, Any] = {"kept": k, "calibration": _summary(cal)}
        held = ev.figures(order[:k], heldout, FIDELITY_MIN_PAIRS) if cal["pass"] else None
        if held is not None:
            step["heldout"] = _summary(held)
        logger.info(
            f"{k} units in fp32 {order[:k]}: calibration {_fmt(cal)}"
            + (f"; held-out {_fmt(held)}" if held is not None else "")
        )
        out["trajectory"].append(step)
        if held is not None and held["pass"]:
            break
        k += 1
        if k > max_keep:
            raise CertificationError(
                f"{mode} refused: no plan with at most {max_keep} of {len(names)} units in fp32 passes the gates "
                f"(whole graph in {low}: {_fmt_summary(out['whole_graph'])}; with {k - 1} units in fp32: "
                f"calibration {_fmt_summary(step['calibration'])}"
                + (f", held-out {_fmt_summary(step['heldout'])}" if "heldout" in step else "")
                + "). Use fp32 (the default).",
                out,
            )
        if not order:  # the whole graph failed: rank the units by what keeping each alone in fp32 does
            out["sensitivity"] = unit_sensitivity(ev, calibration)
            order = out["order"] = sensitivity_order(out["sensitivity"], names)
        cal = ev.figures(order[:k], calibration)
    out.update(keep_fp32=order[:k], calibration=cal, heldout=held)
    return out


def _fmt(fig: dict) -> str:
    return _fmt_summary(_summary(fig))


def _fmt_summary(s: dict) -> str:
    m = s["margins"]
    return (
        f"{'pass' if s['pass'] else 'FAIL'} (max |dCP| {s['max_abs_dcp']:.2e} [margin {m['max_abs_dcp']:+.2e}], "
        f"max |dPF| {s['max_abs_dpf']:.2e} [margin {m['max_abs_dpf']:+.2e}], Spearman CP {s['spearman_cp']:.6f} "
        f"[margin {m['spearman_cp']:+.2e}] / PF {s['spearman_pf']:.6f} [margin {m['spearman_pf']:+.2e}], "
        f"{s['pairs']} pairs; gates |d| <= {FIDELITY_MAX_ABS_DELTA:g}, Spearman >= {FIDELITY_MIN_SPEARMAN:g})"
    )


def _pair_set(given, default: Callable[[], tuple[list, dict]]) -> tuple[list, dict]:
    """``given`` (a pairs CSV path, or Pairs) as a pair list with its description; else the default."""
    if given is None:
        return default()
    if isinstance(given, (str, Path)):
        return read_pairs_csv(given), {"source": str(given)}
    return list(given), {"source": "given pairs"}


def certify_bundle(
    bundle_dir: str | Path,
    *,
    calibration: str | Path | Sequence | None = None,
    heldout: str | Path | Sequence | None = None,
    graphs: Sequence[str] | None = None,
    threads: int | None = None,
    max_keep: int | None = None,
) -> dict:
    """Certify an fp32 bundle for bf16 on OpenVINO's CPU plugin and write the certificate into its
    manifest (in place; nothing is written when it is refused).

    Args:
        bundle_dir: an fp32 scorer bundle, or an fp32 embedder bundle (CLIP, DINO, DINOv2: its
            pairs' image-image and image-text cosines are gated, :data:`EMBEDDER_SCORES`).
        calibration, heldout: pairs CSVs (or lists of :class:`~masc_engine.runtime.scorer.Pair`)
            replacing the default sets (:func:`default_calibration`, :func:`default_heldout`);
            held-out needs ``FIDELITY_MIN_PAIRS`` pairs.
        graphs: the graphs run in bf16 (default :data:`DEFAULT_GRAPHS_BY_KIND`: a scorer's
            ``vision``, an embedder's ``image``; the text graph too if asked).
        threads: OpenVINO / ONNX Runtime threads while scoring.
        max_keep: most units kept in fp32 (default half the units).

    Returns:
        The ``manifest["precision"]`` record written.

    Raises:
        BackendUnavailableError: openvino missing or no native bf16 on this CPU.
        CertificationError: the gates fail (figures in the message and ``report``).
        BundleError: not an fp32 bundle.
    """
    from ..engine.manifest import write_manifest
    from ..errors import BundleError

    check_available(precision="bf16")
    t0 = time.time()
    ev = _evaluator(bundle_dir, graphs, threads)
    graphs = ev.graphs
    mode = (ev.bundle.manifest.get("precision") or {}).get("mode", "fp32")
    if mode not in ("fp32", BF16_CPU):
        raise BundleError(f"bundle {bundle_dir} holds {mode} graphs; bf16-cpu certifies an fp32 bundle")
    cal, cal_info = _pair_set(calibration, default_calibration)
    held, held_info = _pair_set(heldout, default_heldout)
    cal_info["pairs"], held_info["pairs"] = len(cal), len(held)
    if len(held) < FIDELITY_MIN_PAIRS:
        raise CertificationError(
            f"bf16-cpu needs at least {FIDELITY_MIN_PAIRS} held-out pairs for its gates to count; "
            f"{held_info['source']} has {len(held)}",
            {"pairs": {"heldout": held_info}},
        )
    scored = (
        " (an embedder: CP is the image-image cosine, PF the image-text one)"
        if isinstance(ev, EmbedderEvaluator)
        else ""
    )
    logger.info(
        f"bf16-cpu certification of {', '.join(graphs)}{scored}: {len(cal)} calibration pairs ({cal_info['source']}), "
        f"{len(held)} held-out pairs ({held_info['source']}), against fp32 ONNX Runtime"
    )
    found = search_keep_list(ev, cal, held, max_keep)
    record = certificate_record(ev.units, found["keep_fp32"], graphs)
    record.update(
        gates={
            "calibration": found["calibration"],
            "heldout": found["heldout"],
            "thresholds": {
                "max_abs_delta": FIDELITY_MAX_ABS_DELTA,
                "min_spearman": FIDELITY_MIN_SPEARMAN,
                "min_pairs_heldout": FIDELITY_MIN_PAIRS,
            },
        },
        reference="fp32 ONNX Runtime CPU on this bundle (graph variant auto)",
        pairs={"calibration": cal_info, "heldout": held_info},
        search={k: found[k] for k in ("whole_graph", "sensitivity", "order", "trajectory")},
        configurations_scored=ev.configurations,
        seconds=round(time.time() - t0, 1),
        claim="scores are certified to the gates against fp32, not bit-equal to fp32",
    )
    if isinstance(ev, EmbedderEvaluator):
        record["scores"] = dict(EMBEDDER_SCORES)
    manifest = dict(ev.bundle.manifest, precision=record)
    write_manifest(ev.bundle.path, manifest)
    logger.info(
        f"bf16-cpu certified: {len(found['keep_fp32'])} units kept in fp32 {found['keep_fp32']}; held-out "
        f"{_fmt(found['heldout'])}"
    )
    return record
