"""What every model of the runtime owns: :class:`Encoder`, the base of the scorer and the segmenter.

An encoder is one bundle (engine/bundle.py) run through the backend registry
(engine/backends/registry.py). The base owns:

- the :class:`~masc_engine.engine.bundle.Bundle`, loaded with its kind checked;
- the preprocessing recipe the manifest records, as data (``image_settings``, and
  ``text_settings`` with its ``tokenizer`` when the bundle has a text tower);
- one runner per graph, made through the registry on first use (or at construction, for the
  graphs a subclass asks for then), each made once however many threads ask at the same time;
- the backends its graphs run on (:attr:`Encoder.BACKENDS`, a declared property of the model:
  None is every backend of the registry);
- batching by shape (:func:`batches_by_shape`: no input is ever padded, so an item's outputs are
  the same bits in any batch);
- :meth:`Encoder.identity` / :meth:`Encoder.describe`, :meth:`Encoder.close` and the context
  manager.

A new model (another embedder) is one subclass naming its bundle kind, its graphs and, when they
cannot run everywhere, its backends.

Also here: :class:`LRU`, the one in-memory least-recently-used mapping of the runtime
(``cachetools.LRUCache``; a value larger than the whole cache is dropped, not raised on).
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Hashable, Mapping, Sequence, TypeVar

import cachetools
import numpy as np
from PIL import Image

from ..engine.backends.base import Runner
from ..engine.backends.registry import get_backend
from ..engine.bundle import PORTABLE, Bundle
from ..engine.stage_clock import timed
from ..errors import BackendUnavailableError, BundleError
from .preprocess import ImageSettings, PreprocessedImage, preprocess_image
from .text import PromptTokenizer, TextSettings


_E = TypeVar("_E", bound="Encoder")


class LRU(cachetools.LRUCache[Any, Any]):
    """``cachetools.LRUCache`` that drops a value larger than the whole cache instead of raising.

    Eviction is least-recently-used: a lookup (``[key]``, ``get``) makes an entry the most recent,
    a membership test (``in``) does not. A value whose size (``getsizeof``; default 1 per entry)
    exceeds ``maxsize`` is not kept and removes the key's older value (``maxsize=0`` keeps nothing).

    Args:
        maxsize: the bound: entries, or the sum of ``getsizeof`` over the entries.
        getsizeof: the size of one value (e.g. its bytes); None: 1 each.

    Raises:
        ValueError: ``maxsize`` is negative.
    """

    def __init__(self, maxsize: int, getsizeof: Callable[[Any], int] | None = None) -> None:
        if int(maxsize) < 0:
            raise ValueError(f"an LRU's maxsize must be >= 0, got {maxsize!r}")
        super().__init__(int(maxsize), getsizeof)

    def __setitem__(self, key: Any, value: Any) -> None:
        if self.getsizeof(value) > self.maxsize:
            self.pop(key, None)
            return
        super().__setitem__(key, value)


def batches_by_shape(keys: Sequence[Hashable], batch_size: int) -> list[list[int]]:
    """Item indices in batches of one shape each: grouped by key (groups in first-seen order, items
    in order within a group), each group cut into runs of at most ``batch_size``.

    Batches of one shape need no padding, so an item's outputs are the same bits whatever else is
    in its batch (tests/test_batch_invariance.py checks equality, not closeness).

    Args:
        keys: one shape key per item (a patch count, a sequence length; a constant for
            fixed-size inputs).
        batch_size: the most items per batch, >= 1.

    Returns:
        Lists of indices into ``keys``; every index exactly once.
    """
    groups: dict[Hashable, list[int]] = {}
    for i, k in enumerate(keys):
        groups.setdefault(k, []).append(i)
    return [m[s : s + batch_size] for m in groups.values() for s in range(0, len(m), batch_size)]


@dataclass(frozen=True)
class RunnerSettings:
    """How an encoder's runners are made (the arguments of ``Bundle.runner`` besides the graph).

    Attributes:
        backend: a registry name (engine/backends/registry.py ``BACKENDS``).
        provider: the backend's provider; None: the backend's default.
        precision: the precision asked for (None: the bundle's / the only engine set).
        intra_op_threads: CPU threads per graph (None: the backend's default).
        variant: the graph variant (``portable``, ``ort-cpu``; engine/bundle.py).
        options: the backend's own options (its registry entry lists them).
    """

    backend: str = "onnxruntime"
    provider: str | None = None
    precision: str | None = None
    intra_op_threads: int | None = None
    variant: str = PORTABLE
    options: Mapping[str, Any] | None = None

    def factory(self, bundle: Bundle) -> Callable[[str], Any]:
        """``graph -> Runner`` over ``bundle`` with these settings (``bundle.runner`` looked up at each
        call). A partial over the bundle and these settings, not a closure over an encoder: an
        encoder keeping it holds no reference to itself (no cycle: its engines' device memory is
        freed when the last reference goes, without a gc pass)."""
        return functools.partial(_load_runner, bundle, self)


def _load_runner(bundle: Bundle, settings: RunnerSettings, graph: str) -> Runner:
    """``bundle.runner(graph)`` with ``settings``."""
    return bundle.runner(
        graph,
        backend=settings.backend,
        provider=settings.provider,
        intra_op_threads=settings.intra_op_threads,
        precision=settings.precision,
        variant=settings.variant,
        options=None if settings.options is None else dict(settings.options),
    )


def runner_property(graph: str) -> property:
    """A property for the runner of ``graph`` (:meth:`Encoder.runner`: made on first use). Assigning
    it replaces that runner (a calibration wraps the vision runner in a recording one)."""

    def get(self: Encoder) -> Runner:
        return self.runner(graph)

    def put(self: Encoder, runner: Runner) -> None:
        self.replace_runner(graph, runner)

    return property(get, put, doc=f"The ``{graph}`` graph's runner (made on first use; thread-safe).")


class Encoder:
    """A bundle's graphs behind lock-guarded lazy runners, with the bundle's preprocessing recipe.

    Subclasses declare :attr:`KIND`, :attr:`GRAPHS` and, when their graphs run on some backends
    only, :attr:`BACKENDS`.

    Args:
        bundle: a bundle directory or a loaded :class:`~masc_engine.engine.bundle.Bundle` (of
            :attr:`KIND`).
        runners: how runners are made (:class:`RunnerSettings`).
        batch_size: the most items per graph call, an int >= 1.
        verify: check file hashes before first use (engine/bundle.py; ``"all"``: every file now).

    Attributes:
        bundle: the :class:`~masc_engine.engine.bundle.Bundle`.
        runner_settings: the :class:`RunnerSettings`.
        image_settings: the manifest's ``image`` recipe (runtime/preprocess.py ``ImageSettings``), or
            None for a bundle without an image section (an embedder's is its ``recipe`` table).
        text_settings: the manifest's ``text`` recipe (runtime/text.py ``TextSettings``), or None
            for a bundle without a text section; ``tokenizer``: its ``PromptTokenizer`` (the
            tokenizer file's sha256 checked first), or None.

    Raises:
        ValueError: ``batch_size`` is not an int >= 1.
        BundleError: the bundle is missing, incomplete or of another kind.
    """

    #: ``manifest["kind"]`` of the bundles this encoder runs.
    KIND: str = "scorer"
    #: The graphs it runs (:meth:`check_graphs` hashes them all).
    GRAPHS: tuple[str, ...] = ()
    #: The backends that run its graphs; None: every backend of the registry.
    BACKENDS: tuple[str, ...] | None = None
    #: Said after the backends to use when another backend is asked for (e.g. the providers).
    BACKENDS_HINT: str = ""

    def __init__(
        self, bundle: str | Path | Bundle, runners: RunnerSettings, *, batch_size: int, verify: bool | str = True
    ):
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        self.bundle = self.open_bundle(bundle, verify)
        self.runner_settings = runners
        self._batch_size = int(batch_size)
        m = self.bundle.manifest
        self.image_settings = ImageSettings.from_manifest(m["image"]) if "image" in m else None
        self.text_settings = TextSettings.from_manifest(m["text"]) if "text" in m else None
        self.tokenizer = (
            None
            if self.text_settings is None
            else PromptTokenizer(self.bundle.checked_file(self.text_settings.tokenizer_file), self.text_settings)
        )
        self._make_runner: Callable[[str], Any] | None = runners.factory(self.bundle)
        self._runners: dict[str, Runner] = {}
        self._runner_lock = threading.Lock()

    @classmethod
    def open_bundle(cls, bundle: str | Path | Bundle, verify: bool | str = True) -> Bundle:
        """``bundle`` loaded as a bundle of :attr:`KIND` (a loaded one is checked, not reloaded).

        Raises:
            BundleError: missing, incomplete, or a bundle of another kind.
        """
        if not isinstance(bundle, Bundle):
            return Bundle(bundle, verify=verify, kind=cls.KIND)
        if bundle.kind != cls.KIND:
            raise BundleError(f"bundle {bundle.path} is a {bundle.kind} bundle, not a {cls.KIND} bundle")
        return bundle

    # ------------------------------------------------------------------ backend and runners

    @property
    def backend(self) -> str:
        """The registry name of the backend its runners are made on."""
        return self.runner_settings.backend

    @property
    def provider(self) -> str | None:
        """The backend's provider (None: the backend's default)."""
        return self.runner_settings.provider

    @property
    def precision(self) -> str:
        """The precision of its graphs (the bundle's record, engine/bundle.py ``Bundle.precision``)."""
        return self.bundle.precision

    @property
    def batch_size(self) -> int:
        """The most items per graph call."""
        return self._batch_size

    def check_backend(self) -> None:
        """Check now, without making a runner, that the backend runs this encoder's graphs
        (:attr:`BACKENDS`) and is available on the provider (the registry's ``check_available``).

        Raises:
            BackendUnavailableError: a backend not in :attr:`BACKENDS`, or one whose package,
                provider or hardware is missing.
        """
        s = self.runner_settings
        if self.BACKENDS is not None and s.backend not in self.BACKENDS:
            raise BackendUnavailableError(
                f"backend {s.backend!r} does not run {self.KIND} bundles; use "
                f"{' or '.join(self.BACKENDS)}{self.BACKENDS_HINT}"
            )
        get_backend(s.backend).check_available(s.provider)

    def runner(self, graph: str) -> Runner:
        """The runner of ``graph``, made through the backend registry on first use. Made once:
        threads asking at the same time wait for the first one's runner.

        Raises:
            RuntimeError: the encoder was closed.
            BundleError, BackendUnavailableError: as ``Bundle.runner`` (on the first use).
        """
        r = self._runners.get(graph)
        if r is not None:
            return r
        with self._runner_lock:
            if self._make_runner is None:
                raise RuntimeError(f"this {type(self).__name__} was closed")
            r = self._runners.get(graph)
            if r is None:
                r = self._runners[graph] = self._make_runner(graph)
            return r

    def replace_runner(self, graph: str, runner: Runner) -> None:
        """Use ``runner`` for ``graph`` from now on (a calibration wraps the vision runner).

        Raises:
            RuntimeError: the encoder was closed.
        """
        with self._runner_lock:
            if self._make_runner is None:
                raise RuntimeError(f"this {type(self).__name__} was closed")
            self._runners[graph] = runner

    def check_graphs(self) -> None:
        """Check the sha256 of every graph file of :attr:`GRAPHS` (in the runners' graph variant) now,
        with its weights (a driver does, before workers load the bundle unverified).

        Raises:
            BundleError: a graph file is not the one the manifest lists.
        """
        for g in self.GRAPHS:
            self.bundle.graph_file(g, self.runner_settings.variant)

    # ------------------------------------------------------------------ inputs and batches

    @property
    def image_recipe(self) -> ImageSettings:
        """:attr:`image_settings`, for the code that encodes images.

        Raises:
            BundleError: the bundle has no ``image`` section.
        """
        if self.image_settings is None:
            raise BundleError(f"bundle {self.bundle.path} has no image section: it encodes no images")
        return self.image_settings

    @property
    def prompt_tokenizer(self) -> PromptTokenizer:
        """:attr:`tokenizer`, for the code that encodes prompts.

        Raises:
            BundleError: the bundle has no ``text`` section.
        """
        if self.tokenizer is None:
            raise BundleError(f"bundle {self.bundle.path} has no text section: it encodes no prompts")
        return self.tokenizer

    @property
    def text_recipe(self) -> TextSettings:
        """:attr:`text_settings`, for the code that encodes prompts.

        Raises:
            BundleError: the bundle has no ``text`` section.
        """
        if self.text_settings is None:
            raise BundleError(f"bundle {self.bundle.path} has no text section: it encodes no prompts")
        return self.text_settings

    @timed("preprocess:siglip2")
    def preprocess(self, image: Image.Image) -> PreprocessedImage:
        """One image by the manifest's image recipe (runtime/preprocess.py ``preprocess_image``)."""
        return preprocess_image(image, self.image_recipe)

    def batches(self, keys: Sequence[Hashable]) -> list[list[int]]:
        """:func:`batches_by_shape` with this encoder's ``batch_size``."""
        return batches_by_shape(keys, self.batch_size)

    # ------------------------------------------------------------------ identity and lifetime

    def identity(self) -> dict[str, Any]:
        """What decides this encoder's outputs, as plain JSON-able values: the bundle's fingerprint
        (its graphs and settings), the backend and provider (float32 kernels differ in the last
        bits) and the graphs' precision."""
        return {
            "fingerprint": self.bundle.fingerprint,
            "backend": self.backend,
            "provider": self.provider,
            "precision": self.precision,
        }

    def describe(self) -> dict[str, Any]:
        """The encoder for a run's sidecar: its bundle folder, source model and :meth:`identity`."""
        return {"bundle": str(self.bundle.path), "source_model": self.bundle.manifest.get("source"), **self.identity()}

    def close(self) -> None:
        """Release the runners now (TensorRT contexts, engines and their device memory, ONNX Runtime
        sessions). Idempotent; the encoder cannot run after (:meth:`runner` raises RuntimeError).
        ``with <encoder> as e:`` closes on exit."""
        with self._runner_lock:
            runners, self._runners, self._make_runner = list(self._runners.values()), {}, None
        for r in runners:
            close = getattr(r, "close", None)  # TensorRT's runners hold device memory; others have none
            if callable(close):
                close()

    def __enter__(self: _E) -> _E:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
