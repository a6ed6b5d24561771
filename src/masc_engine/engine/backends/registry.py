"""The backend registry: one entry per inference backend, looked up by name.

Each entry says what the rest of the library needs to know about a backend without importing it
(its module is imported on first use: TensorRT and OpenVINO are optional): its default provider,
which providers compute on a GPU, which backend-specific options it takes (with their choices;
the first is the default), and two calls into its module:

- ``check_available(provider, precision)``: cheap, no session made; raises
  :class:`~masc_engine.errors.BackendUnavailableError` naming what to install or choose instead;
- ``load_runner(bundle, graph, *, provider, precision, intra_op_threads, variant, options)``: a
  :class:`~masc_engine.engine.backends.base.Runner` for one graph of a bundle.

Nothing above ``engine/`` branches on a backend's name: the scorer, the jobs and the commands ask
this registry (Polygraphy's loaders: loading apart from running, one interface for every backend).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Mapping, Protocol, cast

from ...errors import BackendUnavailableError

if TYPE_CHECKING:
    from .base import Runner


class BackendModule(Protocol):
    """What a backend's module provides (the two calls the registry makes into it)."""

    def check_available(self, *, provider: str, precision: str | None = None) -> None:
        """Raise :class:`~masc_engine.errors.BackendUnavailableError` unless the backend can run."""

    # bundle: an engine/bundle.py Bundle (not imported here: bundle.py imports this registry).
    def load_runner(
        self,
        bundle: Any,
        graph: str,
        *,
        provider: str,
        precision: str | None = None,
        intra_op_threads: int | None = None,
        variant: str = "portable",
        options: Mapping[str, Any] | None = None,
    ) -> Runner:
        """A runner for ``graph`` of ``bundle``."""


@dataclass(frozen=True)
class BackendOption:
    """An option of one backend only.

    Attributes:
        name: its keyword (``ort_memory``); the command line spells it ``--ort-memory``.
        choices: allowed values, the first being the default.
        help: one sentence for ``--help``.
    """

    name: str
    choices: tuple[str, ...]
    help: str


@dataclass(frozen=True)
class BackendSpec:
    """One backend of the registry.

    Attributes:
        name: the name users choose (``--backend``).
        module: the module holding ``check_available`` and ``load_runner`` (imported on first use).
        default_provider: the provider used when none is chosen.
        gpu_providers: providers on which this backend computes on a CUDA GPU.
        options: the backend's own options (:class:`BackendOption`).
        variants: graph variants it can run besides ``portable`` (ONNX Runtime: the fused
            ``ort-cpu`` graphs on CPU).
    """

    name: str
    module: str
    default_provider: str
    gpu_providers: tuple[str, ...] = ()
    options: tuple[BackendOption, ...] = ()
    variants: tuple[str, ...] = ()

    def _module(self) -> BackendModule:
        # one of the backend modules of this package, each providing check_available and load_runner
        return cast(BackendModule, importlib.import_module(self.module))

    def check_available(self, provider: str | None = None, precision: str | None = None) -> None:
        """Raise unless this backend can run on ``provider`` (default: its own) at ``precision``.

        Raises:
            BackendUnavailableError: the package, the provider or the hardware is missing.
        """
        self._module().check_available(provider=provider or self.default_provider, precision=precision)

    def load_runner(
        self,
        bundle: Any,
        graph: str,
        *,
        provider: str | None = None,
        precision: str | None = None,
        intra_op_threads: int | None = None,
        variant: str = "portable",
        options: Mapping[str, Any] | None = None,
    ) -> Runner:
        """A runner for ``graph`` of ``bundle`` on this backend (see the module's ``load_runner``)."""
        return self._module().load_runner(
            bundle,
            graph,
            provider=provider or self.default_provider,
            precision=precision,
            intra_op_threads=intra_op_threads,
            variant=variant,
            options=self.resolve_options(options),
        )

    def is_gpu(self, provider: str | None = None) -> bool:
        """Whether this backend computes on a CUDA GPU with ``provider`` (default: its own)."""
        return (provider or self.default_provider) in self.gpu_providers

    def option(self, name: str) -> BackendOption:
        """The option ``name`` of this backend (KeyError if it has none)."""
        return {o.name: o for o in self.options}[name]

    def resolve_options(self, options: Mapping[str, Any] | None) -> Mapping[str, Any]:
        """``options`` checked against this backend's, every missing one at its default.

        Raises:
            ValueError: an option this backend does not take, or a value not among its choices.
        """
        options = dict(options or {})
        mine = {o.name: o for o in self.options}
        unknown = sorted(set(options) - set(mine))
        if unknown:
            takes = ", ".join(mine) or "none"
            raise ValueError(f"backend {self.name!r} takes no option {', '.join(unknown)} (its options: {takes})")
        out: dict[str, Any] = {}
        for name, opt in mine.items():
            value = options.get(name, opt.choices[0])
            if value not in opt.choices:
                raise ValueError(
                    f"backend {self.name!r}: {name} must be one of {', '.join(map(str, opt.choices))}, got {value!r}"
                )
            out[name] = value
        return MappingProxyType(out)


_SPECS = (
    BackendSpec(
        "onnxruntime",
        "masc_engine.engine.backends.onnxruntime",
        "cpu",
        gpu_providers=("cuda", "CUDAExecutionProvider"),
        options=(
            BackendOption(
                "ort_memory",
                ("lean", "arena"),
                "ONNX Runtime CPU memory: lean (no CPU arena, no memory patterns: memory is weights + the batch "
                "in flight) or arena (ONNX Runtime's defaults; keeps its high-water mark).",
            ),
        ),
        variants=("ort-cpu",),
    ),
    BackendSpec(
        "tensorrt",
        "masc_engine.engine.backends.tensorrt",
        "cuda",
        gpu_providers=("cuda", "cuda:0", "CUDAExecutionProvider"),
        options=(
            BackendOption(
                "cuda_graphs",
                ("off", "on"),
                "CUDA graphs for repeated input shapes: off (every run enqueued one by one) or on (one graph "
                "per shape set, captured after its first run and replayed; checked on the test fake only, "
                "unverified on a GPU until bench/gpu_check.py runs, hence off by default).",
            ),
        ),
    ),
    BackendSpec("openvino", "masc_engine.engine.backends.openvino", "cpu"),
)

#: Every backend by name, in the order the CLI lists them.
BACKENDS: Mapping[str, BackendSpec] = MappingProxyType({s.name: s for s in _SPECS})


def get_backend(name: str) -> BackendSpec:
    """The registry entry of backend ``name``.

    Raises:
        BackendUnavailableError: no backend of that name.
    """
    try:
        return BACKENDS[name]
    except KeyError:
        raise BackendUnavailableError(f"unknown backend {name!r}; available: {', '.join(BACKENDS)}") from None
