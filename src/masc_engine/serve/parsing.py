"""Request bodies read and checked: JSON validated by the models off the event loop, multipart
forms with their text parts bounded while parsing."""

from __future__ import annotations

import asyncio
import json
from contextlib import aclosing
from typing import Any

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


#: The text fields of a multipart request; each may come as text or as a file upload.
TEXT_FIELDS = ("prompt", "object_name", "stripper")
_FIELDS = (*BYTE_FIELDS, *TEXT_FIELDS)


class _FormParser(MultiPartParser):
    """Starlette's multipart parser with the request's rules applied as each part arrives.

    - each part names a field of the request, once: counted per field, so a text field may come
      as a file upload (``curl -F prompt=@prompt.txt``), and a fifth file is not "too many";
    - a text field sent as text is UTF-8 (Starlette falls back to Latin-1), as one sent as a file;
    - :attr:`closed`: whether python-multipart reached the closing delimiter (``--<boundary>--``):
      it drops a last part that a body cut short leaves unterminated, and Starlette's
      ``finalize`` does not check.

    Raises:
        ApiError: from ``parse``: 422 ``unknown_field``, ``bad_value`` (a field sent twice) or
            ``wrong_type`` (a text field not UTF-8), naming the field.
    """

    closed = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seen: set[str] = set()

    def on_headers_finished(self) -> None:
        super().on_headers_finished()
        name = self._current_part.field_name
        if name not in _FIELDS:
            raise ApiError(422, "unknown_field", name, f"{name}: not a field of /v1/score")
        if name in self.seen:
            raise ApiError(422, "bad_value", name, f"{name}: sent more than once")
        self.seen.add(name)

    def on_part_end(self) -> None:
        part = self._current_part
        if part.file is None and part.field_name in TEXT_FIELDS:
            self.items.append((part.field_name, _utf8(bytes(part.data), part.field_name)))
        else:
            super().on_part_end()

    def on_end(self) -> None:
        self.closed = True


async def _read_form(request: Request, cfg) -> FormData:
    """The multipart form of a body that ends with its closing delimiter.

    Raises:
        ApiError: 400 ``malformed_multipart`` (not multipart, or cut short: a part left out would
            change the score), 422 ``prompt_too_long`` (a text part over ``--max-prompt-bytes``),
            422 ``unknown_field``, ``bad_value`` or ``wrong_type`` (:class:`_FormParser`).
    """
    try:
        # Text fields are cut off at the prompt budget while parsing (never held whole); file
        # parts are spooled by Starlette and bounded by --max-body-mb.
        async with aclosing(request.stream()) as stream:
            # One part per field (_FormParser): Starlette's own counts are a backstop that an
            # eighth part, refused by name first, never reaches.
            n = len(_FIELDS) + 1
            parser = _FormParser(request.headers, stream, max_files=n, max_fields=n, max_part_size=cfg.max_prompt_bytes)
            form = await parser.parse()
    except (ApiError, BodyTimeout, ClientDisconnect):
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
    texts = {k: await _text_part(form.get(k), k, cfg) for k in TEXT_FIELDS}
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
    return _utf8(await v.read(cfg.max_prompt_bytes + 1), name)


def _utf8(data: bytes, name: str) -> str:
    """A text field's bytes as UTF-8, whether sent as text or as a file.

    Raises:
        ApiError: 422 ``wrong_type`` naming the field.
    """
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ApiError(422, "wrong_type", name, f"{name}: not UTF-8 text") from e
