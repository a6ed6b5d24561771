"""Typed errors, so callers (the CLI, an eval service) can tell failures apart."""


class MascEngineError(Exception):
    """Base class of every error raised on purpose by masc-engine."""


class BundleError(MascEngineError):
    """A bundle directory is missing, incomplete, tampered with, or of another format version."""


class BackendUnavailableError(MascEngineError):
    """A requested backend or execution provider is not available (never silently replaced)."""


class ExportValidationError(MascEngineError):
    """An exported graph disagrees with PyTorch beyond the tolerance (the report is attached)."""

    def __init__(self, message: str, report: dict | None = None):
        super().__init__(message)
        self.report = report or {}


class InputError(MascEngineError, ValueError):
    """A scoring input (image, mask, CSV row) is unusable; the message names file, row, reason.

    A ``ValueError``, so callers written for masc-metric (which raises ``ValueError`` for bad
    inputs) catch it too.
    """

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


class EngineCompatibilityError(MascEngineError):
    """A serialized TensorRT engine was built for another GPU, compute capability or TensorRT
    version (or from other ONNX graphs) than the ones loading it; the message names both sides
    and the command that rebuilds the engines."""


class DeviceMemoryError(MascEngineError):
    """Device memory cannot hold what was asked: an engine set's plan over the budget at build, an
    engine that would not fit the GPU's free memory at load (refused before the first batch), or
    an execution context TensorRT could not give memory to. The message names the engine, the
    profile or shapes, the figures, and what to change."""


class ProfileError(InputError):
    """An input shape lies outside every optimization profile of an engine (refused before
    inference; the message gives the allowed range)."""

    def __init__(self, detail: str):
        super().__init__("outside_engine_profile", detail)


class MissingDependencyError(MascEngineError, ImportError):
    """An optional package is not installed; the message names the extra and the pip command
    (see :mod:`masc_engine.extras`)."""


class MissingModelError(MascEngineError, OSError):
    """A model the run needs (the spaCy pipeline ``en_core_web_sm``) is not installed; the message
    gives the command that installs it."""
