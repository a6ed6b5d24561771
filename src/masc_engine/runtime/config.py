"""The scorer's settings in one place: :class:`ScorerConfig`.

Everything that decides how a :class:`~masc_engine.runtime.scorer.Scorer` turns a bundle and
inputs into CP and PF lives in this frozen dataclass: the backend and its provider, precision and
graph variant, the PF prompt stripper, the mask threshold, the NaFlex patch budget, batch size,
threads, where CP runs, and the options of one backend (``backend_options``). The command-line
option group that builds it is ``masc_engine.cli.options.scorer_options``; masc-run, masc-rank and
masc-serve all take it.

A config as given may leave choices to the bundle (``None`` / ``"auto"``); the scorer resolves
them once it has read the bundle (:meth:`ScorerConfig.resolve`) and keeps the resolved config as
``Scorer.config``. Its :meth:`~ScorerConfig.identity` is what every consumer of "which scorer made
this" reads: masc-run's resume fingerprint and sidecar, the encoding store's namespace (through
:meth:`~ScorerConfig.encoding_identity`), the Ray workers (which receive the config itself).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from .masks import DEFAULT_FG_THRESHOLD, MASK_SIZE_POLICIES
from .stripping import STRIPPERS

if TYPE_CHECKING:
    from ..engine.bundle import Bundle

#: ``Scorer(graph_variant=AUTO)``: the bundle's fused ``ort-cpu`` graphs for ONNX Runtime on CPU
#: when it has them, else the portable graphs (engine/bundle.py).
AUTO = "auto"
#: ``cp_head`` values: numpy on the host (runtime/heads.py) or the bundle's ``cp`` graph.
CP_HEADS = ("numpy", "graph")


def _frozen(options: Mapping[str, Any] | tuple[tuple[str, Any], ...] | None) -> tuple[tuple[str, Any], ...]:
    """Backend options as sorted ``(name, value)`` pairs: hashable and picklable (Ray workers
    receive the config), unlike a dict or a mapping proxy."""
    return tuple(sorted(dict(options or {}).items()))


@dataclass(frozen=True)
class ScorerConfig:
    """How a scorer runs a bundle (frozen: safe to share, hash and send to Ray workers).

    Attributes:
        backend: ``"onnxruntime"``, ``"tensorrt"`` or another name of the backend registry
            (engine/backends/registry.py), or ``"auto"`` (the bundle's own backend: the one its
            precision record names, else ONNX Runtime).
        provider: ``"cpu"`` or ``"cuda"``; ``None``: the backend's default (``cpu`` for ONNX
            Runtime, ``cuda`` for TensorRT). A missing provider is an error, never a fallback.
        precision: ``None`` (the bundle's own graphs / its only engine set) or a name the backend
            checks against the bundle (``fp32``, ``fp16``, ``bf16``).
        graph_variant: ``"auto"``, ``"portable"`` or a variant the bundle holds (``"ort-cpu"``).
        stripper: PF prompt stripper, one of :data:`~masc_engine.runtime.stripping.STRIPPERS`.
        fg_threshold: mask threshold on the patch grid in ``[0, 1]``; ``None``: the manifest's
            (masc-metric 0.3.0's ``DEFAULT_FG_THRESHOLD``, 0.5).
        naflex_max_patches: NaFlex patch budget (``>= 1``); ``None``: the manifest's.
        batch_size: images (and prompts) per graph call, ``>= 1``.
        intra_op_threads: backend threads per call (``>= 0``; ``None`` or 0: the backend's choice).
        cp_head: ``"numpy"``, ``"graph"`` or ``None`` (``graph`` when device-resident).
        device_resident: keep patch tokens on the token device; ``None``: on exactly when the
            backend computes on a GPU.
        mask_size_policy: ``"refuse"`` a mask whose size differs from its image's, or
            ``"stretch"`` it as the reference does.
        backend_options: options of the chosen backend only (e.g. ONNX Runtime's
            ``{"ort_memory": "lean"}``), checked by that backend's registry entry; given as a
            mapping, kept as sorted ``(name, value)`` pairs (:attr:`options` reads them as a dict).
    """

    backend: str = AUTO
    provider: str | None = None
    precision: str | None = None
    graph_variant: str = AUTO
    stripper: str = "regex"
    fg_threshold: float | None = None
    naflex_max_patches: int | None = None
    batch_size: int = 8
    intra_op_threads: int | None = None
    cp_head: str | None = None
    device_resident: bool | None = None
    mask_size_policy: str = "refuse"
    #: Given as a mapping or as pairs; held as sorted ``(name, value)`` pairs (``__post_init__``).
    backend_options: Mapping[str, Any] | tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "backend_options", _frozen(self.backend_options))
        self._check()

    # ------------------------------------------------------------------ checks

    @property
    def options(self) -> dict[str, Any]:
        """:attr:`backend_options` as a dict."""
        return dict(self.backend_options)

    def _check(self) -> None:
        """Types and ranges, before any bundle is read.

        Raises:
            TypeError: an option of the wrong type (named).
            ValueError: a value out of range or not among the choices (named).
        """
        for name in ("backend", "graph_variant", "stripper", "mask_size_policy"):
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"{name} must be a str, got {type(getattr(self, name)).__name__}")
        for name in ("provider", "precision", "cp_head"):
            v = getattr(self, name)
            if v is not None and not isinstance(v, str):
                raise TypeError(f"{name} must be a str or None, got {type(v).__name__}")
        _check_int("batch_size", self.batch_size, 1)
        _check_int("naflex_max_patches", self.naflex_max_patches, 1, optional=True)
        _check_int("intra_op_threads", self.intra_op_threads, 0, optional=True)
        if self.fg_threshold is not None:
            v = self.fg_threshold
            if isinstance(v, bool) or not isinstance(v, (int, float, np.floating, np.integer)):
                raise TypeError(f"fg_threshold must be a number, got {type(v).__name__}")
            if not 0.0 <= float(v) <= 1.0:
                raise ValueError(f"fg_threshold must be in [0, 1], got {v}")
        if self.stripper not in STRIPPERS:
            raise ValueError(f"stripper must be one of {STRIPPERS}, got {self.stripper!r}")
        if self.mask_size_policy not in MASK_SIZE_POLICIES:
            raise ValueError(f"mask_size_policy must be one of {MASK_SIZE_POLICIES}, got {self.mask_size_policy!r}")
        if self.cp_head is not None and self.cp_head not in CP_HEADS:
            raise ValueError(f"cp_head must be one of {CP_HEADS} or None, got {self.cp_head!r}")
        if self.device_resident is not None and not isinstance(self.device_resident, bool):
            raise TypeError(f"device_resident must be a bool or None, got {type(self.device_resident).__name__}")
        if self.device_resident and self.cp_head == "numpy":
            raise ValueError("device_resident=True needs cp_head='graph' (the numpy head reads host memory)")

    def resolve(self, bundle: Bundle) -> "ScorerConfig":
        """This config with every choice left to the bundle made (what ``Scorer.config`` holds),
        except ``precision``, which the loaded vision runner reports (TensorRT picks the only engine
        set present; ONNX Runtime reports the graphs' own).

        Rules: ``backend="auto"`` is the backend the bundle's precision record names (a
        ``bf16-cpu`` bundle: OpenVINO), else ONNX Runtime; ``provider=None`` is the backend's
        default; ``graph_variant="auto"`` is the variant the bundle holds for this backend and
        provider (engine/bundle.py); ``fg_threshold`` and ``naflex_max_patches`` default to the
        manifest's; ``device_resident=None`` is on exactly when the backend computes on a GPU;
        ``cp_head=None`` is ``graph`` when device-resident, else ``numpy``; missing backend options
        take the backend's defaults.

        Raises:
            BackendUnavailableError: an unknown backend, or a variant for another backend.
            BundleError: a variant the bundle does not hold.
            ValueError: a backend option the backend does not take, or device-resident with the
                numpy CP head.
        """
        from ..engine.backends.registry import get_backend

        backend = self.backend if self.backend != AUTO else bundle_backend(bundle)
        spec = get_backend(backend)
        provider = self.provider or spec.default_provider
        m = bundle.manifest
        resident = spec.is_gpu(provider) if self.device_resident is None else self.device_resident
        return self.replace(
            backend=backend,
            provider=provider,
            graph_variant=bundle.resolve_variant(self.graph_variant, backend, provider),
            fg_threshold=float(
                self.fg_threshold
                if self.fg_threshold is not None
                else m["scoring"].get("fg_threshold", DEFAULT_FG_THRESHOLD)
            ),
            naflex_max_patches=int(self.naflex_max_patches or m["image"]["max_num_patches"]),
            device_resident=resident,
            cp_head=self.cp_head or ("graph" if resident else "numpy"),
            backend_options=spec.resolve_options(self.options),
        )

    def replace(self, **changes: Any) -> "ScorerConfig":
        """A copy with ``changes`` applied (checked like a new config)."""
        return dataclasses.replace(self, **changes)

    # ------------------------------------------------------------------ identity

    def identity(self) -> dict[str, Any]:
        """The settings that can change a score, as plain JSON-able values.

        Meaningful on a resolved config (``Scorer.config``): masc-run's resume fingerprint and
        sidecar record it, so two runs share a journal exactly when their identities (and run
        settings) are equal. Left out because results do not depend on them: ``batch_size`` and
        ``intra_op_threads`` (tests/test_batch_invariance.py), ``device_resident`` (the same
        graphs on the same device; tests/test_device_resident.py), ``backend_options`` (memory
        settings) and ``mask_size_policy`` (the API's mask check; masc-run checks masks by its
        own run settings). The keys are the ones masc-run has always fingerprinted, so journals
        and caches written before this class existed stay valid.
        """
        return {
            "stripper": self.stripper,
            "fg_threshold": None if self.fg_threshold is None else float(self.fg_threshold),
            "budget": self.naflex_max_patches,
            "provider": self.provider,
            "cp_head": self.cp_head,
            "backend": self.backend,
            "precision": self.precision,
            "graph_variant": self.graph_variant,
        }

    def option_identity(self) -> dict[str, Any]:
        """:meth:`identity` keyed by the command-line option that sets each value (what a rerun
        with other settings names: ``--stripper: regex -> none``)."""
        return {IDENTITY_OPTIONS[k]: v for k, v in self.identity().items()}

    def to_dict(self) -> dict[str, Any]:
        """Every field as plain JSON-able values (masc-run's sidecar records it)."""
        d = dataclasses.asdict(self)
        d["backend_options"] = self.options
        return d

    def encoding_identity(self) -> dict[str, Any]:
        """The part of :meth:`identity` that changes a stored patch token or text embedding: the
        encoding store's namespace, with the bundle fingerprint and the EXIF policy
        (jobs/pairs.py ``encoding_namespace``). The stripper, threshold and CP head act after
        encoding, so runs that differ only there share cached encodings."""
        ident = self.identity()
        return {k: ident[k] for k in ("budget", "provider", "backend", "precision", "graph_variant")}


#: :meth:`ScorerConfig.identity` keys -> the command-line option that sets each (the threshold is
#: the bundle's; no option sets it).
IDENTITY_OPTIONS = {
    "stripper": "--stripper",
    "fg_threshold": "fg_threshold",
    "budget": "--max-num-patches",
    "provider": "--provider",
    "cp_head": "--cp-head",
    "backend": "--backend",
    "precision": "--precision",
    "graph_variant": "--graph-variant",
}


def bundle_backend(bundle: Bundle) -> str:
    """The backend a bundle is for when none is chosen: the one its precision record names
    (``masc-export --precision bf16-cpu`` certifies the graphs on OpenVINO), else ONNX Runtime."""
    return str((bundle.manifest.get("precision") or {}).get("backend") or "onnxruntime")


def _check_int(name: str, v: object, lo: int, optional: bool = False) -> None:
    if v is None and optional:
        return
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    if v < lo:
        raise ValueError(f"{name} must be >= {lo}, got {v}")
