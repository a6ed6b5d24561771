"""masc-engine: torch-free scoring engine for MaSC (arXiv 2605.22469).

Layers: ``export`` (torch, build time only) -> ``engine`` (bundle, manifest, backends) ->
``runtime`` (torch-free scoring) -> ``protocols`` and ``cli``.
"""

__version__ = "0.1.0"
