"""What one export makes, checked before any work: :class:`ExportPlan`.

An export is a model (a scorer or a segmenter checkpoint), the precision its ONNX graphs hold, an
optional certification of those graphs for another runtime's precision, and the backends it is
built for. The plan holds them apart: ``precision`` is the graphs' dtype (``fp32``, ``fp16``,
``bf16``, ``int8``, ``fp8``); ``certify="bf16-cpu"`` certifies fp32 graphs for bf16 on OpenVINO's
CPU plugin (export/cpu_precision.py), which masc-export spells ``--precision bf16-cpu``
(:meth:`ExportPlan.from_option`) and bundles record as ``manifest["precision"]["mode"] ==
"bf16-cpu"`` (:attr:`ExportPlan.mode`; the manifest is unchanged by the plan).

The legal combinations of precision, certification, backend and model kind are enforced here, in
the library (:meth:`ExportPlan.validate`, run on construction): a plan that cannot be exported is
refused with :class:`ExportPlanError`, one line naming masc-export's options, before any file is
read or any network call is made. The rules that depend on the model's kind apply once it is known
(export/plan_steps.py ``resolve_kind``: a CLIPSeg checkpoint makes a segmenter bundle).

export/plan_steps.py runs a plan's steps (it imports the exporter; this module imports nothing
of it, so that the exporter can check its own arguments with a plan).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..engine.backends.openvino import BF16_CPU_MODE
from ..errors import MascEngineError

#: Graph dtypes an export can write (``precision``).
GRAPH_PRECISIONS = ("fp32", "fp16", "bf16", "int8", "fp8")
#: Certifications of fp32 graphs for another runtime's precision (``certify``).
CERTIFICATIONS = (BF16_CPU_MODE,)
#: masc-export's ``--precision`` choices: the graph dtypes and the certification, in its order.
PRECISION_OPTIONS = ("fp32", "fp16", "bf16", "int8", BF16_CPU_MODE, "fp8")
#: ``onnx``: the ONNX bundle only; ``tensorrt``: also TensorRT engines built from its graphs.
BACKENDS = ("onnx", "tensorrt")
#: Model kinds: a SigLIP2 scorer bundle, a CLIPSeg segmenter bundle or a CLIP / DINO / DINOv2
#: embedder bundle (export/embedders.py).
KINDS = ("scorer", "segmenter", "embedder")
#: What each CPU-only mode makes (the reason it refuses ``--backend tensorrt``).
_CPU_ONLY = {
    BF16_CPU_MODE: "a bundle for OpenVINO's CPU plugin",
    "fp8": "an ONNX bundle certified on CPU",
    "int8": "an ONNX Runtime (CPU) bundle",
}
#: The modes a segmenter bundle exports (docs/segmenter.md).
_SEGMENTER_MODES = ("fp32", "fp16")
#: An embedder bundle's: fp32 graphs, certified or not for bf16 on OpenVINO's CPU plugin.
_EMBEDDER_MODES = ("fp32", BF16_CPU_MODE)


class ExportPlanError(MascEngineError, ValueError):
    """An export plan combines options that do not go together (precision, certification, backend,
    model kind, the options of each); one line naming masc-export's options. masc-export reports it
    as a usage error (exit status 2)."""


@dataclass(frozen=True)
class ExportPlan:
    """One export's settings, validated on construction (:meth:`validate`).

    Attributes:
        model: Hugging Face id, short name, local checkpoint directory or ``random:<preset>``.
        precision: the ONNX graphs' dtype, one of :data:`GRAPH_PRECISIONS`; None: fp32 for a new
            export, the bundle's own for ``engines_only`` (:attr:`graph_precision`).
        certify: None, or ``"bf16-cpu"``: the fp32 graphs certified for bf16 on OpenVINO's CPU plugin.
        backend: ``onnx`` or ``tensorrt`` (:data:`BACKENDS`).
        kind: ``scorer`` or ``segmenter``; None until known (export/plan_steps.py ``resolve_kind``).
        engines_only: build TensorRT engines for the existing bundle at the output, no export.
        max_num_patches: NaFlex patch budget (None: 1024, the paper's); scorers only.
        revision: Hub revision to pin.
        calibration_pairs, heldout_pairs: pairs CSVs of the bf16-cpu / fp8 certification.
        bf16_graphs: bf16-cpu: the graphs certified to run in bf16 (None: the kind's default, the
            image tower; export/cpu_precision.py ``CERTIFIABLE_GRAPHS_BY_KIND`` lists the others).
        gate_pairs: pairs CSV the int8 bundle is gated on (required for int8).
        fp32_bundle: int8 / fp8: an existing fp32 bundle to start from instead of exporting one.
        max_memory_gb: the export's memory limit, GB (None: this machine's or container's).
        max_batch, max_outs_per_ref: TensorRT profile maxima (1..4096).
        gpu_memory_budget: TensorRT engine set's device memory budget, GiB (None: free memory).
        timing_cache: TensorRT timing cache file (None: the default under the cache folder).

    Raises:
        ExportPlanError: on construction (or :func:`dataclasses.replace`), an illegal combination.
    """

    model: str
    precision: str | None = None
    certify: str | None = None
    backend: str = "onnx"
    kind: str | None = None
    engines_only: bool = False
    max_num_patches: int | None = None
    revision: str | None = None
    calibration_pairs: str | None = None
    heldout_pairs: str | None = None
    bf16_graphs: tuple[str, ...] | None = None
    gate_pairs: str | None = None
    fp32_bundle: str | None = None
    max_memory_gb: float | None = None
    max_batch: int = 16
    max_outs_per_ref: int = 16
    gpu_memory_budget: float | None = None
    timing_cache: str | None = None

    def __post_init__(self) -> None:
        self.validate()

    @classmethod
    def from_option(cls, precision: str | None, certify: str | None = None, **settings) -> ExportPlan:
        """The plan of masc-export's ``--precision`` value: ``bf16-cpu`` is fp32 graphs with
        ``certify="bf16-cpu"``; any other value is the graphs' dtype (None: not given)."""
        if precision in CERTIFICATIONS:
            precision, certify = "fp32", certify or precision
        return cls(precision=precision, certify=certify, **settings)

    @property
    def graph_precision(self) -> str:
        """The dtype of the graphs a new export writes (``fp32`` when none was given)."""
        return self.precision or "fp32"

    @property
    def mode(self) -> str:
        """The bundle's precision mode as manifests record it (``manifest["precision"]["mode"]``):
        the certification when there is one, else the graphs' dtype."""
        return self.certify or self.graph_precision

    @property
    def certification_options(self) -> dict | None:
        """Keyword arguments of the bf16-cpu certification (export/cpu_precision.py
        ``certify_bundle``), or None without one."""
        if self.certify is None:
            return None
        options: dict = {"calibration": self.calibration_pairs, "heldout": self.heldout_pairs}
        if self.bf16_graphs:
            options["graphs"] = self.bf16_graphs
        return options

    def validate(self) -> None:
        """Refuse an illegal plan, in masc-export's order of checks.

        Raises:
            ExportPlanError: an unknown value; a certification of other than fp32 graphs; a CPU-only
                mode (bf16-cpu, int8, fp8) with ``--backend tensorrt``; certification pairs without
                bf16-cpu or fp8; ``engines_only`` without TensorRT; once the kind is known, a
                segmenter with a scorer's option (patch budget, bf16 / bf16-cpu / int8, TensorRT),
                or int8 without gate pairs.
        """
        self._check_values()
        if self.mode in _CPU_ONLY and self.backend != "onnx":
            raise ExportPlanError(f"--precision {self.mode} makes {_CPU_ONLY[self.mode]}: use --backend onnx")
        if (self.calibration_pairs or self.heldout_pairs) and self.mode not in (*CERTIFICATIONS, "fp8"):
            raise ExportPlanError("--calibration-pairs / --heldout-pairs go with --precision bf16-cpu or fp8")
        if self.engines_only and self.backend != "tensorrt":
            raise ExportPlanError("--engines-only builds TensorRT engines: add --backend tensorrt")
        self._check_bf16_graphs()
        if self.kind == "segmenter" and (
            self.backend == "tensorrt" or self.max_num_patches or self.mode not in _SEGMENTER_MODES
        ):
            raise ExportPlanError(
                "a segmenter bundle exports fp32 or fp16 ONNX graphs for ONNX Runtime (cpu or "
                "cuda); --max-num-patches, --precision bf16/bf16-cpu/int8 and --backend tensorrt "
                "are the scorer's (docs/segmenter.md)"
            )
        if self.kind == "embedder" and (
            self.backend == "tensorrt" or self.max_num_patches or self.mode not in _EMBEDDER_MODES or self.engines_only
        ):
            raise ExportPlanError(
                "an embedder bundle (CLIP, DINO, DINOv2) exports fp32 ONNX graphs for ONNX Runtime, "
                "certified for OpenVINO's bf16 with --precision bf16-cpu; --max-num-patches, other "
                "precisions and --backend tensorrt are not available for it (docs/export.md)"
            )
        if self.kind is not None and self.precision == "int8" and not self.gate_pairs:
            raise ExportPlanError(
                "--precision int8 needs --gate-pairs CSV: int8 is kept only if it passes "
                "its gates against fp32 on those pairs"
            )

    def _check_bf16_graphs(self) -> None:
        """``bf16_graphs`` goes with bf16-cpu, names no graph twice and, once the kind is known,
        only graphs that kind's certification can run in bf16."""
        if self.bf16_graphs is None:
            return
        if self.certify != BF16_CPU_MODE:
            raise ExportPlanError("--bf16-graphs goes with --precision bf16-cpu")
        if not self.bf16_graphs or len(set(self.bf16_graphs)) != len(self.bf16_graphs):
            raise ExportPlanError(f"--bf16-graphs needs distinct graph names, got {','.join(self.bf16_graphs)!r}")
        if self.kind in ("scorer", "embedder"):
            from .cpu_precision import CERTIFIABLE_GRAPHS_BY_KIND

            legal = CERTIFIABLE_GRAPHS_BY_KIND[self.kind]
            unknown = [g for g in self.bf16_graphs if g not in legal]
            if unknown:
                raise ExportPlanError(
                    f"--bf16-graphs: {'an' if self.kind == 'embedder' else 'a'} {self.kind} bundle certifies "
                    f"{' and '.join(legal)} for bf16, "
                    f"not {', '.join(unknown)}"
                )

    def _check_values(self) -> None:
        for name, value, legal in (
            ("precision", self.precision, (None, *GRAPH_PRECISIONS)),
            ("certify", self.certify, (None, *CERTIFICATIONS)),
            ("backend", self.backend, BACKENDS),
            ("kind", self.kind, (None, *KINDS)),
        ):
            if value not in legal:
                raise ExportPlanError(f"export plan: {name} must be one of {[v for v in legal if v]}, got {value!r}")
        if self.certify is not None and self.graph_precision != "fp32":
            raise ExportPlanError(
                f"{self.certify} certifies fp32 graphs, not {self.precision}: use --precision {self.certify} alone"
            )
