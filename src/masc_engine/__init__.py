"""masc-engine: torch-free scoring engine for MaSC (arXiv 2605.22469).

Layers from the bottom, each importing only those before it: the shared leaves (``errors``,
``tolerances``, ``extras``), ``metrics`` (pure statistics: agreement, rank correlation, the
reduced-precision certification), ``engine`` (bundle, manifest, backends), ``runtime``
(torch-free scoring), ``export`` (torch, build time only), ``jobs`` (the job layer every command
and the service share), ``report``, ``serve``, ``cli`` (pyproject.toml ``[tool.importlinter]``,
tests/test_layers.py).

``from masc_engine import MaSC`` is the drop-in for ``masc.MaSC`` (built on a bundle);
``MaSC(bundle, segmenter=...)`` makes the masks optional (docs/segmenter.md).
"""

__version__ = "0.1.0"

# Before any submodule can import onnxruntime (engine/vendor_telemetry.py says why).
from .engine.vendor_telemetry import decline_onnxruntime_telemetry  # noqa: E402

decline_onnxruntime_telemetry()

from .runtime.scorer import MaSC, MaSCResult, Pair, Scorer  # noqa: E402
from .runtime.segmenter import MaskRecipe, Segmenter, SegmenterConfig  # noqa: E402

__all__ = ["MaSC", "MaSCResult", "MaskRecipe", "Pair", "Scorer", "Segmenter", "SegmenterConfig", "__version__"]
