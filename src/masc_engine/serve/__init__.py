"""masc-serve: MaSC as an HTTP service (the ``serve`` extra: FastAPI, uvicorn, prometheus-client).

``app`` (routes, schemas, errors) -> ``batcher`` (dynamic micro-batching) -> ``glue`` (the one
module that calls the library: masc-run's row logic on request bytes) -> the runtime. ``limits``
and ``metrics`` hold the body/pixel limits and the Prometheus registry.
"""
