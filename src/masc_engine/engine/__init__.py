"""The engine: bundles, their manifests and the backends that run their graphs (torch-free)."""
