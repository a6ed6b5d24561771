"""A bundle: a directory of ONNX graphs, tokenizer files and ``manifest.json``.

Loading checks the format and that every listed file exists; by default each file's sha256 is
checked before its first use (a run hashes only the graphs it loads). It hands out runners for its
graphs on an explicitly chosen backend, provider and graph variant.

Graph variants: ``portable`` (the standard-op graphs every backend builds, TensorRT included) and
``ort-cpu`` (the vision and text graphs fused with ONNX Runtime's transformer optimizer into
``com.microsoft`` contrib ops, export/fusion.py; only for ONNX Runtime on CPU). The manifest's
``variants[<name>]`` says which backend and provider a variant is for and how it was validated;
each graph it replaces lists its file under ``graphs[<graph>]["variants"][<name>]``; its other
graphs are the portable ones.
"""

from __future__ import annotations

import posixpath
import warnings
from pathlib import Path
from typing import Any

from ..errors import BackendUnavailableError, BundleError, MascEngineError
from .backends.base import Runner
from .backends.openvino import BF16_CPU_MODE
from .backends.registry import get_backend
from .manifest import (
    check_confined,
    check_consistency,
    check_ranges,
    confined,
    fingerprint,
    one_line,
    read_manifest,
    verify_files,
)
from . import verified_files
from .stage_clock import stage
from .onnx_wire import WireError, external_data_locations


#: The standard-op graphs (``manifest["graphs"]``).
PORTABLE = "portable"
#: ``Scorer(graph_variant="auto")``: the fused ``ort-cpu`` graphs for ONNX Runtime on CPU when
#: the bundle has them, else the portable graphs.
AUTO = "auto"


class RandomWeightsWarning(UserWarning):
    """Scores from a random-weight test bundle measure nothing; they only test the pipeline."""


def random_weights_note(path: str | Path, manifest: dict[str, Any]) -> str | None:
    """The one line every command prints for a random-weight bundle (``WARNING: <this>``), or
    None when ``manifest["source"]`` does not say ``random_weights``."""
    source = manifest.get("source", {})
    if not source.get("random_weights"):
        return None
    return f"bundle {path} was exported from random weights ({source.get('model')}): its scores only test the pipeline"


def _caller_stacklevel() -> int:
    """The ``stacklevel`` that makes a warning name the first caller outside masc_engine (the
    user's ``MaSC(...)`` line), not a line of the library that loads the bundle for it."""
    import sys

    package = str(Path(__file__).resolve().parents[1])
    frame, level = sys._getframe(2), 2  # level 1 is the function that calls warnings.warn
    while frame.f_back is not None and frame.f_code.co_filename.startswith(package):
        frame, level = frame.f_back, level + 1
    return level


#: Where each kind of bundle is given on the command lines.
_OPTION_OF_KIND = {"scorer": "--bundle", "segmenter": "--segmenter", "embedder": "--embedder NAME=BUNDLE"}


def _article(word: str) -> str:
    return "an" if word[:1] in "aeiou" else "a"


class Bundle:
    """An exported bundle, loaded read-only.

    Attributes:
        path: the bundle directory.
        manifest: the parsed ``manifest.json``.
        fingerprint: 16 hex chars identifying the bundle's content and settings.
    """

    def __init__(self, path: str | Path, verify: bool | str = True, kind: str = "scorer"):
        """Load a bundle.

        Args:
            path: the bundle folder (``manifest.json`` and the files it lists).
            verify: ``True`` (default): every listed file must exist now, and each file's sha256
                is checked before its first use (a runner's graph and weights, the tokenizer), so
                a run hashes only what it loads (start-up time: the fused and portable
                graphs of a base bundle are 1.3 GB), and a file an earlier process hashed to
                the same digest and that has not changed since is not read again
                (engine/verified_files.py). ``"all"``: hash every file now. ``False``:
                no check.
            kind: the bundle kind the caller runs: ``scorer`` (SigLIP2 graphs; manifests written
                before kinds existed are scorers) or ``segmenter`` (runtime/segmenter.py).

        Raises:
            BundleError: missing directory, manifest or listed file; a bundle of another kind;
                a file name that leaves the bundle folder (``..``, an absolute path, a symlink
                out: engine/manifest.py ``check_confined``); a number out of range
                (``check_ranges``: patch size, patch budget, text length, widths, shapes); a
                scorer manifest whose settings disagree with the graph shapes it declares
                (``check_consistency``); with ``"all"``, a modified file.
        """
        self.path = Path(path)
        self.manifest = read_manifest(self.path)
        if self.kind != kind:
            raise BundleError(
                f"bundle {self.path} is {_article(self.kind)} {self.kind} bundle, not {_article(kind)} {kind} "
                f"bundle (pass it as {_OPTION_OF_KIND.get(self.kind, '--bundle')})"
            )
        check_confined(self.path, self.manifest)
        check_ranges(self.manifest, str(self.path))
        if self.kind == "scorer":
            check_consistency(self.manifest, str(self.path))
        self.verify = verify
        # False: OpenVINO compiles this bundle's graphs in memory only, nothing in its compiled-model
        # cache (a bf16 certification's candidates: each an in-memory manifest scored once, whose
        # compiled graphs no later process would import: 3.3 GB each at so400m/1024, 0.7 GB at
        # base/256; 49 such folders, 22 GB, were found in one machine's cache root).
        self.compiled_model_cache = True
        self._verified: set[str] = set()
        self._graphs_checked: set[str] = set()
        if verify == "all":
            verify_files(self.path, self.manifest)
            self._verified.update(self.manifest["files"])
        elif verify:
            for name in self.manifest["files"]:
                if not (self.path / name).is_file():
                    raise BundleError(f"bundle {self.path}: file {name} listed in the manifest is missing")
        self.fingerprint = fingerprint(self.manifest)
        note = random_weights_note(self.path, self.manifest) if self.random_weights else None
        if note is not None:
            warnings.warn(note, RandomWeightsWarning, stacklevel=_caller_stacklevel())

    @property
    def kind(self) -> str:
        """``scorer`` or ``segmenter`` (``manifest["kind"]``; absent: ``scorer``)."""
        return str(self.manifest.get("kind", "scorer"))

    @property
    def random_weights(self) -> bool:
        """Whether the bundle was exported from random weights (``manifest["source"]``)."""
        return bool((self.manifest.get("source") or {}).get("random_weights"))

    @property
    def precision(self) -> str:
        """The graphs' precision: ``fp32``, ``fp16`` or ``bf16`` (mixed-precision graphs from
        ``masc-export --precision``), ``int8-dynamic``, or ``bf16-cpu`` (fp32 graphs certified
        for bf16 on OpenVINO's CPU plugin, export/cpu_precision.py); bundles written before it was
        recorded are fp32."""
        return str(self.manifest.get("precision", {}).get("mode", "fp32"))

    def file(self, name: str) -> Path:
        """``path / name``, checked to lie inside the bundle folder (no hash check: see
        :meth:`checked_file`).

        Raises:
            BundleError: the name leaves the bundle folder.
        """
        return confined(self.path, name, "file")

    def checked_file(self, name: str, data: list[str] | None = None) -> Path:
        """``file(name)``, checked to lie inside the bundle folder (engine/manifest.py
        ``confined``) and, when the bundle was loaded with ``verify``, its sha256 checked against
        the manifest first (once per bundle object); with it the files ``data`` (the manifest's
        ``external_data`` of a graph), else any listed ``<name>.data``.

        Raises:
            BundleError: the name leaves the bundle folder, or the file (or its weights) is not
                the one the manifest lists.
        """
        path = confined(self.path, name, "file")
        self._check_hash(name)
        extra = list(data) if data is not None else [name + ".data"] if name + ".data" in self.manifest["files"] else []
        for f in extra:
            confined(self.path, f, f"manifest external_data of {name}")
            self._check_hash(f)
        return path

    def _check_hash(self, name: str) -> None:
        if not self.verify or name in self._verified:
            return
        if name not in self.manifest["files"]:
            raise BundleError(
                f"bundle {self.path}: {name} is not listed in the manifest, so its bytes cannot be "
                "checked; re-export the bundle with masc-export"
            )
        digest, path = self.manifest["files"][name], confined(self.path, name, "manifest files")
        with stage("bundle_hash"):
            # A file an earlier process hashed to this digest and that has not changed since is
            # not read again (engine/verified_files.py).
            if not verified_files.known(path, digest):
                verify_files(self.path, {"files": {name: digest}})
                verified_files.remember(path, digest)
        self._verified.add(name)

    def _check_external_data(self, graph: str, name: str) -> None:
        """Confine (and, with ``verify``, hash) the external-data files the graph ``name`` itself
        names: the bytes ONNX Runtime will read, whatever the manifest's ``external_data`` says.

        Raises:
            BundleError: not an ONNX graph; a location that leaves the bundle folder; with
                ``verify``, a location not listed in the manifest or modified.
        """
        if name in self._graphs_checked:
            return
        try:
            locations = external_data_locations(self.path / name)
        except WireError as e:
            raise BundleError(
                f"bundle {self.path}: its {graph} graph {name} is not an ONNX graph ({e}); re-export "
                "the bundle with masc-export"
            ) from None
        except OSError as e:
            raise BundleError(
                f"bundle {self.path}: its {graph} graph {name} cannot be read ({e.strerror or e})"
            ) from None
        field = f"{graph} graph {name}'s external data location"
        for loc in locations:
            confined(self.path, loc, field)  # the location itself: a plain relative name
            rel = posixpath.join(posixpath.dirname(name), loc)
            confined(self.path, rel, field)
            self._check_hash(rel)
        self._graphs_checked.add(name)

    def graph(self, name: str) -> dict[str, Any]:
        """The manifest's entry for graph ``name`` (BundleError when the bundle has none)."""
        try:
            entry: dict[str, Any] = self.manifest["graphs"][name]
        except KeyError:
            raise BundleError(f"bundle {self.path} has no {name!r} graph") from None
        return entry

    @property
    def variants(self) -> list[str]:
        """Graph variants this bundle holds: ``portable`` first, then the manifest's ``variants``."""
        return [PORTABLE] + sorted(self.manifest.get("variants") or {})

    def resolve_variant(self, requested: str, backend: str, provider: str) -> str:
        """The graph variant to run: ``requested`` checked, or ``auto`` resolved.

        ``auto`` is the variant the bundle holds for exactly this backend and provider (the
        manifest's ``variants[<name>]["runtime"]``: the fused ``ort-cpu`` graphs for ONNX Runtime
        on CPU), else ``portable``.

        Raises:
            BundleError: a requested variant this bundle does not hold (never a silent switch).
            BackendUnavailableError: a variant asked for on a backend/provider it is not for.
        """
        provider = _short_provider(provider)
        if requested == AUTO:
            name: str
            for name, entry in sorted((self.manifest.get("variants") or {}).items()):
                want = entry.get("runtime", {})
                if (want.get("backend"), want.get("provider")) == (backend, provider):
                    return name
            return PORTABLE
        if requested == PORTABLE:
            return PORTABLE
        entry = (self.manifest.get("variants") or {}).get(requested)
        if entry is None:
            raise BundleError(
                f"bundle {self.path} has no {requested!r} graph variant (it holds: "
                f"{', '.join(self.variants)}); re-export it with masc-export, or use the portable graphs"
            )
        want = entry.get("runtime", {})
        if (backend, provider) != (want.get("backend"), want.get("provider")):
            raise BackendUnavailableError(
                f"graph variant {requested!r} is for {want.get('backend')} on "
                f"{want.get('provider')}, not {backend} on {provider}"
            )
        return requested

    def graph_file(self, graph: str, variant: str = PORTABLE) -> Path:
        """Path of ``graph`` in ``variant`` (the portable graph where the variant does not replace it),
        its sha256 checked before first use.

        A variant's graph files are listed where the export-time transform pipeline
        (export/transforms.py) records them: ``graphs[<graph>]["variants"][<variant>]["file"]``.
        The external-data files the graph itself names are confined to the bundle folder and,
        with ``verify``, must be listed in the manifest and match it (the bytes the runtime reads).

        Raises:
            BundleError: no such graph or variant; a file outside the bundle folder, not listed,
                modified, or not an ONNX graph.
        """
        entry = self.graph(graph)
        if variant != PORTABLE:
            if variant not in (self.manifest.get("variants") or {}):
                raise BundleError(f"bundle {self.path} has no {variant!r} graph variant")
            entry = (entry.get("variants") or {}).get(variant, entry)
        path = self.checked_file(entry["file"], entry.get("external_data"))
        self._check_external_data(graph, entry["file"])
        return path

    @property
    def graph_precision(self) -> str:
        """The precision the ONNX graphs hold: :attr:`precision`, except ``fp32`` for a ``bf16-cpu``
        bundle (fp32 graphs + an OpenVINO certificate)."""
        return "fp32" if self.precision == BF16_CPU_MODE else self.precision

    def runner(
        self,
        graph: str,
        backend: str = "onnxruntime",
        provider: str | None = None,
        intra_op_threads: int | None = None,
        precision: str | None = None,
        variant: str = PORTABLE,
        options: dict[str, Any] | None = None,
    ) -> Runner:
        """A runner for one of the bundle's graphs (``vision``, ``pool``, ``text``, ``cp``), loaded by
        the backend registry (engine/backends/registry.py).

        Args:
            graph: the graph's name.
            backend: a registry name: ``onnxruntime`` (the ONNX graphs; ``provider`` ``cpu`` or
                ``cuda``), ``tensorrt`` (the engine set ``tensorrt-<precision>/`` built by
                ``masc-export --backend tensorrt``; ``provider`` ``cuda``) or ``openvino`` (the
                portable graphs on OpenVINO's CPU plugin; ``precision`` ``fp32``, or ``bf16`` on a
                ``bf16-cpu`` bundle, its default there).
            provider: the backend's provider; ``None``: the backend's default.
            intra_op_threads: the backend's intra-op threads (None: its default).
            precision: TensorRT: ``fp32``, ``fp16`` or ``bf16`` (default: the only engine set
                present). ONNX Runtime: ``None`` or the bundle's own precision (:attr:`precision`;
                the graphs carry it, their inputs and outputs stay float32).
            variant: ``portable`` or a variant the bundle holds (``ort-cpu``), checked with
                :meth:`resolve_variant` (``auto`` is resolved there too).
            options: the backend's own options (its registry entry lists them, e.g. ONNX
                Runtime's ``ort_memory``); missing ones take their defaults.

        Raises:
            BackendUnavailableError: unknown backend, the provider or the backend's package is
                missing (never a quiet fallback to CPU).
            EngineCompatibilityError: TensorRT engines built for another GPU / TensorRT version.
            BundleError: the bundle has no such graph (or no such engine set), or the backend
                cannot load it (its own error, on one line).
            ValueError: an option the backend does not take.
        """
        self.graph(graph)  # BundleError for an unknown graph, whatever the backend
        spec = get_backend(backend)
        provider = provider or spec.default_provider
        variant = self.resolve_variant(variant, backend, provider)
        try:
            return spec.load_runner(
                self,
                graph,
                provider=provider,
                precision=precision,
                intra_op_threads=intra_op_threads,
                variant=variant,
                options=options,
            )
        except (MascEngineError, ValueError, TypeError):
            raise
        except Exception as e:  # noqa: BLE001 - the backend's own error (ONNX Runtime's Fail, InvalidGraph...)
            raise BundleError(
                f"bundle {self.path}: {backend} could not load its {graph} graph ({variant}): "
                f"{type(e).__name__}: {one_line(e)}"
            ) from None


def _short_provider(provider: str) -> str:
    """``CPUExecutionProvider`` -> ``cpu`` (the inverse of the ONNX Runtime backend's ``PROVIDERS``;
    the runners accept both spellings, the variant check compares the short one)."""
    from .backends.onnxruntime import PROVIDERS

    return {full: short for short, full in PROVIDERS.items()}.get(provider, provider)
