"""Request bodies read and checked: JSON validated by the models off the event loop, multipart
forms with their text parts bounded while parsing."""

from __future__ import annotations

import asyncio
import json
from contextlib import aclosing

from fastapi import Request
from pydantic import ValidationError
from starlette.datastructures import FormData, UploadFile
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.formparsers import MultiPartParser
from starlette.requests import ClientDisconnect

from ..jobs.tables import RepeatedKeyError, unique_object
from ..runtime.stripping import STRIPPERS
from .errors import ApiError, validation_error
from .glue import BYTE_FIELDS
from .limits import BodyTimeout


async def read_body(request: Request) -> bytearray:
    """The whole body in one buffer (Starlette's ``request.body()`` joins a list of chunks: twice
    the body at its peak).

    Raises:
        ClientDisconnect: the client closed the connection before the whole body came (answered
            as ``client_disconnected``, never as a server fault).
    """
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
    return body


async def parse_json(request: Request, model):
    """Read and validate a JSON body; validation runs in a thread, so a large body never stalls
    the event loop (and with it the probes)."""
    body = await read_body(request)
    if not body:
        raise ApiError(400, "malformed_json", None, "the body is empty: send a JSON object")
    try:
        return await asyncio.to_thread(_validate_once_each, model, body)
    except ValidationError as e:
        raise validation_error(e) from e


def _validate_once_each(model, body: bytearray):
    """``model.model_validate_json(body)``, after refusing a JSON object (at any depth) that holds
    one key twice, which pydantic would read as "the last one wins" (422 ``bad_value``, as a
    multipart field sent twice). A body that is not JSON is left to the model's own error."""
    try:
        json.loads(body, object_pairs_hook=unique_object)
    except RepeatedKeyError as e:
        raise ApiError(422, "bad_value", e.key, f"{e.key}: sent more than once in one JSON object") from None
    except (ValueError, RecursionError):
        pass  # not JSON (or past Python's limits): the model's parser names it
    return model.model_validate_json(body)


class _ClosedFormParser(MultiPartParser):
    """Starlette's multipart parser, told whether python-multipart reached the closing delimiter
    (``--<boundary>--``): python-multipart drops a last part that a body cut short leaves
    unterminated, and Starlette's ``finalize`` does not check."""

    closed = False

    def on_end(self) -> None:
        self.closed = True


async def _read_form(request: Request, cfg) -> FormData:
    """The multipart form of a body that ends with its closing delimiter.

    Raises:
        ApiError: 400 ``malformed_multipart`` (not multipart, or cut short: a part left out would
            change the score), 422 ``prompt_too_long`` (a text part over ``--max-prompt-bytes``).
    """
    try:
        # Text fields are cut off at the prompt budget while parsing (never held whole); file
        # parts are spooled by Starlette and bounded by --max-body-mb.
        async with aclosing(request.stream()) as stream:
            parser = _ClosedFormParser(
                request.headers, stream, max_files=len(BYTE_FIELDS), max_fields=8, max_part_size=cfg.max_prompt_bytes
            )
            form = await parser.parse()
    except (BodyTimeout, ClientDisconnect):
        raise
    except Exception as e:  # noqa: BLE001 - python-multipart / Starlette raise several kinds
        if isinstance(e, StarletteHTTPException) and e.status_code != 400:
            raise  # 413: the body limit
        why = str(getattr(e, "detail", None) or getattr(e, "message", None) or e)
        if "exceeded maximum size" in why:  # Starlette's part limit, hit while parsing
            raise ApiError(
                422,
                "prompt_too_long",
                None,
                f"a text field (prompt, object_name or stripper) is over the budget of {cfg.max_prompt_bytes} bytes",
            ) from e
        raise ApiError(400, "malformed_multipart", None, f"the multipart body cannot be parsed: {why}") from e
    if not parser.closed:
        await form.close()
        raise ApiError(
            400,
            "malformed_multipart",
            None,
            "the multipart body ends before its closing delimiter (--<boundary>--): it was cut short; send it whole",
        )
    return form


async def parse_multipart(request: Request, cfg) -> dict:
    """Read a multipart request: its four files' bytes (None: the segmenter's mask) and its text
    fields, each checked (:func:`_read_form`, then the fields).

    Raises:
        ApiError: 400 ``malformed_multipart``, 422 ``unknown_field``, ``bad_value``,
            ``missing_field``, ``wrong_type`` or ``prompt_too_long``, naming the field.
    """
    form = await _read_form(request, cfg)
    try:
        return await _fields(form, cfg)
    finally:
        await form.close()


async def _fields(form: FormData, cfg) -> dict:
    known = set(BYTE_FIELDS) | {"prompt", "object_name", "stripper"}
    for k in form.keys():
        if k not in known:
            raise ApiError(422, "unknown_field", k, f"{k}: not a field of /v1/score")
        if len(form.getlist(k)) > 1:
            raise ApiError(422, "bad_value", k, f"{k}: sent more than once")
    data: dict[str, bytes | None] = {}  # None: the segmenter's mask
    for f in BYTE_FIELDS:
        v = form.get(f)
        if v is None and cfg.segmenter is not None and f in ("ref_mask", "out_mask"):
            data[f] = None  # the segmenter's
            continue
        if v is None:
            raise ApiError(422, "missing_field", f, f"{f}: field required (a file upload, e.g. curl -F {f}=@file)")
        if not isinstance(v, UploadFile):
            raise ApiError(
                422, "wrong_type", f, f"{f}: expected a file upload, got a text field (curl -F {f}=@path, with the @)"
            )
        data[f] = await v.read()
    texts = {k: await _text_part(form.get(k), k, cfg) for k in ("prompt", "object_name", "stripper")}
    if texts["prompt"] is None:
        raise ApiError(422, "missing_field", "prompt", "prompt: field required")
    if texts["stripper"] not in (None, *STRIPPERS):
        raise ApiError(422, "bad_value", "stripper", f"stripper: must be one of {', '.join(STRIPPERS)}")
    return {
        "data": data,
        "prompt": texts["prompt"],
        "object_name": texts["object_name"] or None,
        "stripper": texts["stripper"],
    }


async def _text_part(v, name: str, cfg) -> str | None:
    """A text field, sent as text or as a file upload (whose size is checked before it is read)."""
    if not isinstance(v, UploadFile):
        return v
    if v.size is not None and v.size > cfg.max_prompt_bytes:
        raise ApiError(
            422, "prompt_too_long", name, f"{name}: {v.size} bytes, over the budget of {cfg.max_prompt_bytes} bytes"
        )
    try:
        return (await v.read(cfg.max_prompt_bytes + 1)).decode("utf-8")
    except UnicodeDecodeError as e:
        raise ApiError(422, "wrong_type", name, f"{name}: not UTF-8 text") from e
