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


class InputError(MascEngineError):
    """A scoring input (image, mask, CSV row) is unusable; the message names file, row, reason."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail
