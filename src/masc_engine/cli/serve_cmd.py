"""``masc-serve``: MaSC as an HTTP service (FastAPI on uvicorn; the ``serve`` extra)."""

from __future__ import annotations

import os
import signal
import socket
import stat
import sys

import click

from .logs import PrintableCommand

from ..runtime.text import DEFAULT_MAX_PROMPT_BYTES, DEFAULT_MAX_PROMPT_TOKENS
from .options import (
    STORE_SIZE_GB,
    cache_options,
    embedder_paths,
    exif_option,
    mask_size_tolerance_option,
    metric_options,
    opted_metrics,
    scorer_config,
    scorer_options,
    segmenter_config,
    segmenter_options,
)


@click.command(cls=PrintableCommand, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--bundle", "-b", required=True, type=click.Path(file_okay=False, exists=True), help="Bundle from masc-export."
)
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on (0.0.0.0: every interface; put a reverse proxy with TLS in front).",
)
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@scorer_options
@segmenter_options
@exif_option
@mask_size_tolerance_option
@metric_options
@click.option(
    "--max-batch",
    type=click.IntRange(1, 1024),
    default=8,
    show_default=True,
    help="Most requests coalesced into one scoring call (1: no micro-batching).",
)
@click.option(
    "--max-wait-ms",
    type=click.FloatRange(0, 10000),
    default=5.0,
    show_default=True,
    help="Longest a micro-batch stays open after its first request arrived.",
)
@click.option(
    "--max-queue",
    type=click.IntRange(1, 1000000),
    default=256,
    show_default=True,
    help="Most items waiting for a batch; past it requests get 503 with Retry-After.",
)
@click.option(
    "--cache-mb",
    type=click.FloatRange(0, 1e7),
    default=512.0,
    show_default=True,
    help="In-memory reference-encoding cache (LRU by content hash), bound in MiB of patch tokens; 0: off.",
)
@cache_options(
    None,
    cache_help="Also use masc-run's persistent cache here (one per replica on local disk: see "
    "docs/service.md); a cache that fails later is bypassed and /readyz says "
    '"cache": "degraded".',
    size_help=f"Bound on the persistent cache's size (default: masc-run's, {STORE_SIZE_GB:g} GiB).",
)
@click.option(
    "--max-body-mb",
    type=click.FloatRange(0.001, 1e5),
    default=64.0,
    show_default=True,
    help="Largest request body (413 past it).",
)
@click.option(
    "--max-pixels",
    type=click.IntRange(1, 10**10),
    default=40_000_000,
    show_default=True,
    help="Pixel budget per image (Pillow's decompression-bomb limit, checked from the header).",
)
@click.option(
    "--max-batch-items",
    type=click.IntRange(1, 100000),
    default=64,
    show_default=True,
    help="Most items in one /v1/score_batch request.",
)
@click.option(
    "--request-timeout-s",
    type=click.FloatRange(0.1, 1e5),
    default=60.0,
    show_default=True,
    help="A request not scored within this time gets 503 (and is dropped if not started).",
)
@click.option(
    "--body-timeout-s",
    type=click.FloatRange(0.1, 1e5),
    default=30.0,
    show_default=True,
    help="Deadline for a request's whole body, from its headers (not per read): 408 past it.",
)
@click.option(
    "--header-timeout-s",
    type=click.FloatRange(0.1, 1e5),
    default=10.0,
    show_default=True,
    help="Deadline for a request's headers, from its first byte: 408 and the connection closed past it.",
)
@click.option(
    "--decode-workers",
    type=click.IntRange(1, 256),
    default=2,
    show_default=True,
    help="Threads decoding request images (all of them under --max-decoded-mb).",
)
@click.option(
    "--max-decoded-mb",
    type=click.FloatRange(1, 1e7),
    default=1024.0,
    show_default=True,
    help="Memory for decoding images at once, MiB (each file reserves its cost, known from its header, "
    "before decoding; an image costing more than this is decoded alone).",
)
@click.option(
    "--max-prompt-bytes",
    type=click.IntRange(1, 10**7),
    default=DEFAULT_MAX_PROMPT_BYTES,
    show_default=True,
    help="Longest prompt or object_name, UTF-8 bytes (422 prompt_too_long past it).",
)
@click.option(
    "--max-prompt-tokens",
    type=click.IntRange(1, 10**7),
    default=DEFAULT_MAX_PROMPT_TOKENS,
    show_default=True,
    help="Longest stripped prompt, and longest object name, in tokens (the text tower reads the first 64; 422 prompt_too_long past it).",
)
@click.option(
    "--max-connections",
    type=click.IntRange(1, 10**6),
    default=128,
    show_default=True,
    help="Most requests handled at once (503 JSON with Retry-After past it); /healthz, /readyz and "
    "/metrics are never refused.",
)
@click.option(
    "--graceful-timeout-s",
    type=click.FloatRange(0, 3600),
    default=25.0,
    show_default=True,
    help="On SIGTERM/SIGINT: how long in-flight requests may take to finish.",
)
@click.option(
    "--api-key-file",
    type=click.Path(dir_okay=False),
    default=None,
    help="Require 'Authorization: Bearer <key>' (the file's content, read once at start) on every path "
    "but /healthz, /readyz and /metrics (401 JSON otherwise). Without it nothing is authenticated.",
)
@click.option(
    "--docs",
    is_flag=True,
    help="Serve Swagger UI at /docs and ReDoc at /redoc (their scripts load from a CDN into the "
    "viewer's browser); off by default. /openapi.json is always served.",
)
@click.option(
    "--log-level",
    type=click.Choice(["critical", "error", "warning", "info", "debug"]),
    default="info",
    show_default=True,
)
def main(**params):
    """Serve MaSC scoring over HTTP for the bundle BUNDLE.

    The scorer options are masc-run's; --stripper is the default for requests that name none (a
    request may ask for regex or none, and for spacy only if this is spacy). With --segmenter the
    mask fields are optional: a missing mask is computed from the item's object_name. With
    --metrics (and --embedder) every response also carries the classic metrics named there.

    GET /healthz, /readyz, /metrics; POST /v1/score (JSON with base64 files, or multipart uploads),
    /v1/score_batch. OpenAPI document at /openapi.json. Reference: docs/service.md.
    """
    try:
        import uvicorn

        from ..serve.app import ServeConfig, create_app
        from ..serve.http import guarded_protocol
    except ImportError as e:
        from ..extras import missing

        raise click.ClickException(str(missing(e.name or "fastapi", "masc-serve", extra="serve"))) from None
    import logging

    config = scorer_config(params)
    seg_config = segmenter_config(params, config)
    p = {
        k: v
        for k, v in params.items()
        if k not in ("host", "port", "graceful_timeout_s", "log_level", "api_key_file", "embedder_specs")
    }
    p["metrics"], p["embedders"] = _metrics(params)
    logging.basicConfig(level=params["log_level"].upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    _check_cache_dir(params)
    cfg = ServeConfig(scorer=config, segmenter=seg_config, api_key=_read_api_key(params["api_key_file"]), **p)
    # uvicorn handles SIGTERM and SIGINT: it stops accepting, lets in-flight requests finish (up to
    # --graceful-timeout-s), then runs the app's shutdown, which drains the batcher. Afterwards it
    # restores the previous handler and raises the signal again; this handler turns that into exit
    # status 0 (the default action would end the process "killed by SIGTERM").
    # The port first: taken, the command ends here in one line, before the bundle loads or a
    # "ready" line is logged (uvicorn binds after the app's start-up and exits with status 3).
    sock = _listen(params["host"], params["port"])
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    app = create_app(cfg)
    # The header deadline and JSON 400/408 live in the HTTP protocol; the request limit in the app
    # (uvicorn's limit_concurrency answers plain text and counts header-less sockets).
    protocol = guarded_protocol(
        cfg.header_timeout_s,
        on_reject=app.state.masc.metrics.count_connection_error,
        linger_s=cfg.body_timeout_s,
        linger_bytes=int(cfg.max_body_mb * 2**20),
    )
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=params["host"],
            port=params["port"],
            log_level=params["log_level"],
            http=protocol,
            timeout_graceful_shutdown=params["graceful_timeout_s"],
            access_log=params["log_level"] == "debug",
        )
    )
    server.run(sockets=[sock])
    if not server.started:  # the app's start-up failed (uvicorn logged why)
        raise click.ClickException("masc-serve did not start: see the log lines above")


def _listen(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port``, as uvicorn binds one (``Config.bind_socket``: IPv6 for
    a host with a colon, ``SO_REUSEADDR``); uvicorn listens on it.

    Raises:
        click.ClickException: the address is taken or cannot be bound (one line, exit status 1).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family=family, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise click.ClickException(
            f"--host {host} --port {port}: cannot listen there ({e.strerror or e}); check --host or choose another --port"
        ) from None
    sock.set_inheritable(True)
    return sock


def _metrics(params: dict) -> tuple[tuple[str, ...] | None, dict | None]:
    """``(--metrics, --embedder)`` checked before serving: the opt-in metric names and the bundle
    folder of each embedder they read.

    Raises:
        click.ClickException: an unknown metric, a bad ``--embedder`` or a metric whose embedder is
            not given (one line).
    """
    from ..jobs.pairs import RunSettings
    from ..jobs.pairs.run import check_embedders

    metrics, bundles = opted_metrics(params["metrics"]), embedder_paths(params["embedder_specs"])
    try:
        check_embedders(RunSettings(metrics=metrics), bundles)
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    return metrics, (bundles or None)


def _read_api_key(path: str | None) -> bytes | None:
    """The bearer token in ``path`` (surrounding whitespace dropped), or None without the option.

    Raises:
        click.ClickException: the file cannot be read or holds no key (one line).
    """
    if path is None:
        return None
    try:
        # Non-blocking open: a FIFO without a writer would otherwise hang the start here.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise click.ClickException(
                f"--api-key-file {path}: not a regular file (a FIFO, device or directory is never read)"
            )
        with open(fd, "rb") as f:
            key = f.read(4097).strip()
    except OSError as e:
        raise click.ClickException(f"--api-key-file {path}: cannot read it ({e.strerror or e})") from None
    if not key or len(key) > 4096 or any(c < 0x21 or c > 0x7E for c in key):
        raise click.ClickException(
            f"--api-key-file {path}: expected one key of 1-4096 printable ASCII characters without spaces"
        )
    return key


def _check_cache_dir(params: dict) -> None:
    """Refuse a ``--cache-dir`` that cannot be opened and written, in one line, before serving."""
    if not params["cache_dir"]:
        return
    from ..runtime.cache import DEFAULT_SIZE_LIMIT, CacheError, open_cache

    size = int(params["cache_size_gb"] * 2**30) if params["cache_size_gb"] else DEFAULT_SIZE_LIMIT
    try:
        open_cache(params["cache_dir"], size).close()
    except CacheError as e:
        raise click.ClickException(str(e)) from None


def _exit_on_sigterm(signum, frame):
    sys.exit(0)


if __name__ == "__main__":
    main()
