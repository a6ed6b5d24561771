"""masc-serve: MaSC as an HTTP service (the ``serve`` extra: FastAPI, uvicorn, prometheus-client).

``http`` (uvicorn's protocol with a header deadline and JSON 400/408) -> ``limits`` (the
outermost ASGI guard: body size and deadline, requests in flight, JSON 500) -> ``app`` (routes,
schemas, errors, prompt budgets) -> ``glue`` (the one module that calls the library: the pairs
job's public in-memory calls, in the decode pool) -> ``batcher`` (dynamic micro-batching) ->
the runtime. ``metrics`` holds the Prometheus registry. Reference: docs/service.md.
"""
