"""Command-line options that mean the same in several commands (masc-run, masc-serve, masc-rank):
one definition each, so their ranges, defaults and help cannot drift apart.

:func:`scorer_options` is the option group that builds a
:class:`~masc_engine.runtime.config.ScorerConfig` (:func:`scorer_config`); the backends' own
options (``--ort-memory``) are generated from the backend registry, where each is defined.
:func:`segmenter_options` is the group that builds a
:class:`~masc_engine.runtime.segmenter.SegmenterConfig` (:func:`segmenter_config`).
"""

from __future__ import annotations

import dataclasses

import click

from .logs import secho

from ..engine.backends.registry import BACKENDS
from ..jobs.pairs import RunOptions
from ..runtime.cache import DEFAULT_SIZE_LIMIT
from ..runtime.config import AUTO, CP_HEADS, ScorerConfig
from ..runtime.stripping import STRIPPERS

#: masc-run's job options (:class:`~masc_engine.jobs.pairs.RunOptions`): the defaults of the options
#: below that it owns, read from its fields.
_RUN_DEFAULTS = {f.name: f.default for f in dataclasses.fields(RunOptions)}
#: ``--cache-size-gb`` default of a command that writes the store's default size out (masc-run):
#: the persistent store's own (runtime/cache.py ``DEFAULT_SIZE_LIMIT``, 8 GiB).
STORE_SIZE_GB = DEFAULT_SIZE_LIMIT / 2**30

#: Rows per step of a job (RunOptions.chunk_size).
chunk_size_option = click.option(
    "--chunk-size",
    type=click.IntRange(1, 100000),
    default=_RUN_DEFAULTS["chunk_size"],
    show_default=True,
    help="Rows decoded, scored and journaled per step.",
)


def io_workers_option(detail: str = ""):
    """``--io-workers``: decoding threads (RunOptions.io_workers), ``detail`` appended to its help."""
    return click.option(
        "--io-workers",
        type=click.IntRange(1, 256),
        default=_RUN_DEFAULTS["io_workers"],
        show_default=True,
        help=f"Threads decoding images and masks{detail}.",
    )


def cache_options(size_default: float | None, cache_help: str, size_help: str):
    """``--cache-dir`` and ``--cache-size-gb``: the persistent encoding store (runtime/cache.py).

    Commands differ in one thing, given here: ``size_default``, the ``--cache-size-gb`` default.
    masc-run writes the store's size out (:data:`STORE_SIZE_GB`, shown in ``--help``); masc-serve
    keeps None (``ServeConfig.cache_size_gb``: the store's default applies), so its configuration
    records that no size was chosen. ``--cache-dir``'s default is None in both
    (``RunOptions.cache_dir``).
    """
    dir_option = click.option(
        "--cache-dir", type=click.Path(file_okay=False), default=_RUN_DEFAULTS["cache_dir"], help=cache_help
    )
    size_option = click.option(
        "--cache-size-gb",
        type=click.FloatRange(0.01, 1e6),
        default=size_default,
        show_default=size_default is not None,
        help=size_help,
    )

    def decorate(f):
        return dir_option(size_option(f))

    return decorate


#: Backend intra-op threads.
threads_option = click.option(
    "--threads",
    type=click.IntRange(0, 1024),
    default=0,
    show_default=True,
    help="Inference threads per graph call (0: the backend's default).",
)

#: NaFlex patch budget override.
max_num_patches_option = click.option(
    "--max-num-patches", type=click.IntRange(1, 16384), default=None, help="Override the bundle's NaFlex patch budget."
)

#: EXIF orientation policy (runtime/io.py).
exif_option = click.option(
    "--exif",
    type=click.Choice(["apply", "ignore"]),
    default="apply",
    show_default=True,
    help="EXIF orientation: apply to image and mask alike, or ignore (read stored pixels, as masc-metric does).",
)

#: How far a mask's size may be off its image's before it is refused.
mask_size_tolerance_option = click.option(
    "--mask-size-tolerance",
    type=click.IntRange(0, 64),
    default=0,
    show_default=True,
    help="Stretch a mask at most this many pixels off its image's size instead of refusing it.",
)


def _backend_option_flags() -> list:
    """One click option per backend-specific option of the registry (default None: the backend's
    own default applies, and an option of another backend than the one chosen is an error)."""
    out = []
    for spec in BACKENDS.values():
        for o in spec.options:
            out.append(
                click.option(
                    f"--{o.name.replace('_', '-')}",
                    o.name,
                    type=click.Choice(list(o.choices)),
                    default=None,
                    help=f"({spec.name} only; default {o.choices[0]}) {o.help}",
                )
            )
    return out


_SCORER_OPTIONS = [
    click.option(
        "--backend",
        type=click.Choice([AUTO, *BACKENDS]),
        default=AUTO,
        show_default=True,
        help="Inference backend: onnxruntime (the bundle's ONNX graphs), tensorrt (engines built by "
        "masc-export --backend tensorrt; CUDA; unverified on a GPU) or openvino (CPU; f32, or bf16 "
        "for a bundle certified with masc-export --precision bf16-cpu). auto: the backend a "
        "certified bundle names, else onnxruntime.",
    ),
    click.option(
        "--provider",
        default=None,
        help="Execution provider: cpu or cuda (default: the backend's: cpu; cuda for tensorrt). A "
        "missing provider is an error, never a switch to another.",
    ),
    click.option(
        "--precision",
        type=click.Choice(["fp32", "fp16", "bf16"]),
        default=None,
        help="Precision to run: the TensorRT engine set, OpenVINO f32 or bf16; for ONNX Runtime it must "
        "be the bundle's own (default: the bundle's).",
    ),
    click.option(
        "--graph-variant",
        type=click.Choice([AUTO, "portable", "ort-cpu"]),
        default=AUTO,
        show_default=True,
        help="Graphs to run: the fused ort-cpu vision and text graphs (ONNX Runtime on CPU; auto picks them "
        "when the bundle has them), or the portable standard-op graphs. A variant the bundle lacks "
        "is an error.",
    ),
    click.option(
        "--stripper",
        type=click.Choice(list(STRIPPERS)),
        default="regex",
        show_default=True,
        help="How the subject name is removed from the PF prompt (regex is the paper's).",
    ),
    max_num_patches_option,
    click.option(
        "--batch-size",
        type=click.IntRange(1, 1024),
        default=8,
        show_default=True,
        help="Images (and prompts) per graph call; scores do not depend on it.",
    ),
    threads_option,
    click.option(
        "--cp-head",
        type=click.Choice(list(CP_HEADS)),
        default=None,
        help="CP on the host in numpy, or through the bundle's cp graph on the chosen backend. "
        "Default: graph when device-resident, else numpy.",
    ),
    click.option(
        "--device-resident/--no-device-resident",
        default=None,
        help="Keep patch tokens in GPU memory between the vision graph, the pooling head and the CP "
        "graph (needs CuPy). Default: on exactly when the backend computes on a GPU.",
    ),
    *_backend_option_flags(),
]

#: The click parameter names of the group (what :func:`scorer_config` takes out of a command's
#: keyword arguments).
SCORER_PARAMS = (
    "backend",
    "provider",
    "precision",
    "graph_variant",
    "stripper",
    "max_num_patches",
    "batch_size",
    "threads",
    "cp_head",
    "device_resident",
    *(o.name for spec in BACKENDS.values() for o in spec.options),
)


def scorer_options(f):
    """Decorate a click command with the scorer's option group (:data:`SCORER_PARAMS`)."""
    for opt in reversed(_SCORER_OPTIONS):
        f = opt(f)
    return f


def scorer_config(params: dict) -> ScorerConfig:
    """Take the group's values out of a command's keyword arguments (``params`` is modified) and
    build the :class:`~masc_engine.runtime.config.ScorerConfig`.

    Raises:
        click.UsageError: options that contradict each other (exit status 2, as every usage error).
    """
    v = {k: params.pop(k) for k in SCORER_PARAMS}
    options = {o.name: v[o.name] for spec in BACKENDS.values() for o in spec.options if v[o.name] is not None}
    try:
        return _config(v, options)
    except (TypeError, ValueError) as e:
        raise click.UsageError(str(e)) from e


def _config(v: dict, options: dict) -> ScorerConfig:
    return ScorerConfig(
        backend=v["backend"],
        provider=v["provider"],
        precision=v["precision"],
        graph_variant=v["graph_variant"],
        stripper=v["stripper"],
        naflex_max_patches=v["max_num_patches"],
        batch_size=v["batch_size"],
        intra_op_threads=v["threads"] or None,
        cp_head=v["cp_head"],
        device_resident=v["device_resident"],
        backend_options=options,
    )


_SEGMENTER_OPTIONS = [
    click.option(
        "--segmenter",
        type=click.Path(file_okay=False),
        default=None,
        help="Segmenter bundle (masc-export --model CIDAS/clipseg-rd64-refined): a pair without a mask "
        "(empty or absent mask column or field) gets the segmenter's mask of its image, prompted by its "
        "object_name. See docs/segmenter.md.",
    ),
    click.option(
        "--mask-threshold",
        type=click.FloatRange(0, 1, min_open=True, max_open=True),
        default=None,
        help="The segmenter's threshold on its probability map (default: the segmenter bundle's recipe, 0.5).",
    ),
    click.option(
        "--mask-prompt-template",
        default=None,
        help="The segmenter's prompt, {} standing for the object_name, e.g. 'a photo of a {}' (default: the "
        "bundle's recipe, '{}': the object_name itself).",
    ),
    click.option(
        "--segmenter-provider",
        type=click.Choice(["cpu", "cuda"]),
        default=None,
        help="Where the segmenter runs (ONNX Runtime). Default: the scorer's provider when it is cpu or cuda, "
        "else cpu.",
    ),
]

#: The click parameter names of the segmenter group.
SEGMENTER_PARAMS = ("segmenter", "mask_threshold", "mask_prompt_template", "segmenter_provider")


def segmenter_options(f):
    """Decorate a click command with the segmenter's option group (:data:`SEGMENTER_PARAMS`)."""
    for opt in reversed(_SEGMENTER_OPTIONS):
        f = opt(f)
    return f


def segmenter_config(params: dict, scorer: ScorerConfig):
    """Take the segmenter group's values out of a command's keyword arguments (``params`` is
    modified): the :class:`~masc_engine.runtime.segmenter.SegmenterConfig`, or None without
    ``--segmenter``. Threads and batch size follow the scorer's options.

    Raises:
        click.UsageError: a mask option without ``--segmenter``, or a bad template (exit status 2).
    """
    from ..runtime.segmenter import SegmenterConfig

    v = {k: params.pop(k) for k in SEGMENTER_PARAMS}
    if v["segmenter"] is None:
        given = [f"--{k.replace('_', '-')}" for k in SEGMENTER_PARAMS[1:] if v[k] is not None]
        if given:
            raise click.UsageError(f"{', '.join(given)} without --segmenter: give a segmenter bundle")
        return None
    try:
        return SegmenterConfig(
            v["segmenter"],
            v["mask_threshold"],
            v["mask_prompt_template"],
            provider=v["segmenter_provider"],
            intra_op_threads=scorer.intra_op_threads,
            batch_size=scorer.batch_size,
        )
    except (TypeError, ValueError) as e:
        raise click.UsageError(str(e)) from e


def load_segmenter(config, scorer=None):
    """The command's :class:`~masc_engine.runtime.segmenter.Segmenter` (None without a config), on
    the scorer's provider when none was chosen and the scorer's is one ONNX Runtime runs the
    segmenter on (``cpu``, ``cuda``); its random-weights warning one line on stderr.

    Raises:
        MascEngineError, ValueError: as :meth:`~masc_engine.runtime.segmenter.SegmenterConfig.load`.
    """
    if config is None:
        return None
    if config.provider is None and scorer is not None and scorer.provider in ("cpu", "cuda"):
        config = dataclasses.replace(config, provider=scorer.provider)
    return _one_line_warnings(config.load)


def _one_line_warnings(load):
    """``load()``, its random-weights warning shown as one line on stderr (``WARNING: ...``), not
    as a Python warning pointing into the library."""
    import warnings

    from ..engine.bundle import RandomWeightsWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RandomWeightsWarning)
        obj = load()
    for w in caught:
        if issubclass(w.category, RandomWeightsWarning):
            secho(f"WARNING: {w.message}", fg="yellow", err=True)
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return obj


def load_scorer(bundle: str, config: ScorerConfig):
    """The command's :class:`~masc_engine.runtime.scorer.Scorer`, its random-weights warning shown
    as one line on stderr (``WARNING: ...``), not as a Python warning pointing into the library.

    Raises:
        MascEngineError, ValueError, TypeError: as :class:`~masc_engine.runtime.scorer.Scorer`.
    """
    from ..runtime.scorer import Scorer

    return _one_line_warnings(lambda: Scorer(bundle, config))


#: ``--embedder`` names: the embedders the classic metrics read (runtime/pair_metrics/classic.py).
EMBEDDER_NAMES = ("clip", "dino", "dino_s8", "dinov2", "clip_l14")


def metric_options(f):
    """``--metrics NAMES`` and ``--embedder NAME=BUNDLE`` (repeatable): masc-run's and masc-serve's."""
    f = click.option(
        "--embedder",
        "embedder_specs",
        multiple=True,
        metavar="NAME=BUNDLE",
        help="An embedder bundle from masc-export for the classic metrics (repeatable): "
        f"{', '.join(EMBEDDER_NAMES[:-1])} or {EMBEDDER_NAMES[-1]}.",
    )(f)
    return click.option(
        "--metrics",
        "metrics",
        default=None,
        metavar="NAMES",
        help="Comma-separated metrics to compute: cp and pf always; add the classic ones by name: "
        "clip_i, clip_t (--embedder clip=...), dino, dino_s8, dinov2 (--embedder dino=..., "
        "dino_s8=..., dinov2=...), clip_score_tm (torchmetrics' CLIPScore, --embedder "
        'clip_l14=...), 100 x cosine each (docs/metrics.md, "Classic metrics in masc-run").',
    )(f)


def opted_metrics(spec: str | None) -> tuple[str, ...] | None:
    """The metrics ``--metrics`` asks for beyond those every run computes (None: none, the default
    run, whose settings and fingerprint are those of a run without the option).

    Raises:
        click.ClickException: an unknown metric name (one line naming ``--metrics``).
    """
    from ..runtime.pair_metrics import registered

    if spec is None:
        return None
    known = {m.name: m for m in registered()}
    names = [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise click.ClickException(f"--metrics: unknown metric(s) {', '.join(unknown)}; known: {', '.join(known)}")
    opted = tuple(n for n in names if known[n].option is not None)
    return opted or None


def embedder_paths(specs) -> dict[str, str]:
    """``--embedder NAME=BUNDLE`` options as ``{name: bundle folder}``.

    Raises:
        click.ClickException: a spec without ``=``, an unknown name, a repeated name or a missing folder.
    """
    from pathlib import Path

    out: dict[str, str] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or name not in EMBEDDER_NAMES:
            raise click.ClickException(
                f"--embedder {spec}: expected NAME=BUNDLE with NAME one of {', '.join(EMBEDDER_NAMES)}"
            )
        if name in out:
            raise click.ClickException(f"--embedder {name} given twice")
        if not Path(path).is_dir():
            raise click.ClickException(f"--embedder {name}={path}: no such bundle folder")
        out[name] = path
    return out


def load_embedders(paths: dict[str, str]) -> dict:
    """The ``Embedder`` of each bundle folder (runtime/embedder.py), by name; a random-weights
    bundle says so in one ``WARNING:`` line, as the scorer's and the segmenter's do."""
    from ..runtime.embedder import Embedder

    return {k: _one_line_warnings(lambda v=v: Embedder(v)) for k, v in paths.items()}
