"""The request and response models of masc-serve and the OpenAPI document built from them.

The routes read their bodies themselves (one path takes JSON and multipart, and errors name the
field), so :func:`add_schemas` puts the request models into the document's components.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, Field, create_model
from pydantic.json_schema import JsonDict

from ..runtime.pair_metrics import score_metrics
from ..runtime.stripping import STRIPPERS
from .glue import BYTE_FIELDS

_B64: JsonDict = {"format": "byte", "contentEncoding": "base64"}


class ScoreItem(BaseModel):
    """One pair to score: the four files' bytes as base64 (PNG/JPEG/WebP/TIFF, as masc-run reads
    them), the prompt and the subject name stripped from it for PF."""

    model_config = ConfigDict(extra="forbid", strict=True)
    ref_image: str = Field(description="reference image file, base64", json_schema_extra=_B64)
    ref_mask: str = Field(description="reference foreground mask file, base64", json_schema_extra=_B64)
    out_image: str = Field(description="generated (output) image file, base64", json_schema_extra=_B64)
    out_mask: str = Field(description="output foreground mask file, base64", json_schema_extra=_B64)
    prompt: str = Field(description="the generation prompt")
    object_name: str | None = Field(
        None, description="subject name stripped from the prompt for PF; null or absent: the prompt is not stripped"
    )
    stripper: Literal[STRIPPERS] | None = Field(  # type: ignore[valid-type]
        None, description="PF prompt stripper; default: the server's --stripper"
    )


class ScoreBatch(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    items: list[ScoreItem] = Field(description="pairs to score; results come back in this order")


#: A mask field's description when the server has a segmenter.
_SEGMENTED = (
    "foreground mask file, base64; null or absent: the server's segmenter computes it from "
    "object_name (the record's {side}_mask_source says which)"
)
#: Mask fields that may be left out when the server has a segmenter.
MASK_FIELDS = ("ref_mask", "out_mask")


def _optional_masks() -> tuple[type[BaseModel], type[BaseModel]]:
    """:class:`ScoreItem` and :class:`ScoreBatch` with the mask fields optional (a server started
    with ``--segmenter``); named as the originals, so the OpenAPI document keeps its references."""
    masks: dict[str, Any] = {  # field -> (type, FieldInfo): create_model's field keywords
        f: (
            str | None,
            Field(
                None,
                description=("reference " if f == "ref_mask" else "output ") + _SEGMENTED.format(side=f[:3]),
                json_schema_extra=_B64,
            ),
        )
        for f in MASK_FIELDS
    }
    item = create_model(
        "ScoreItem",
        __base__=ScoreItem,
        __doc__=(ScoreItem.__doc__ or "") + " The masks are optional: "
        "the server's segmenter computes a missing one from object_name.",
        **masks,
    )
    batch = create_model(
        "ScoreBatch",
        __base__=ScoreBatch,
        # a model built at run time
        items=(list[item], Field(description="pairs to score; results come back in this order")),  # type: ignore[valid-type]
    )
    return item, batch


_OPTIONAL_MASKS = _optional_masks()


def request_models(masks_optional: bool) -> tuple[type[BaseModel], type[BaseModel]]:
    """``(item model, batch model)`` of a server with (``masks_optional``) or without a segmenter."""
    return _OPTIONAL_MASKS if masks_optional else (ScoreItem, ScoreBatch)


class ScoreResult(BaseModel):
    """masc-run's record for the pair (docs/commands.md, masc-run), without ``row_index`` and
    ``row_key``; null where a score or figure is undefined. A record of a pair that could not be
    scored (``/v1/score_batch``) carries the status fields and ``prompt_empty`` only.

    Every field a record can hold is declared (tests/test_serve_openapi.py checks the records
    against this list), so a generated client reads each one typed.
    """

    # Every field is declared (the registered metrics' too, below): a generated client reads each
    # one typed, and nothing undeclared reaches a response.
    model_config = ConfigDict(extra="ignore")
    cp: float | None = Field(description="Concept Preservation (masked_maxcos), [-1, 1]; null if undefined")
    pf: float | None = Field(description="Prompt Following, [-1, 1]; null if undefined")
    status: str = Field(description="'ok' or masc-run's reason (docs/commands.md, the status table)")
    status_detail: str = Field(description="field and cause, notes")
    cp_status: str | None = Field(None, description="'ok' or why CP is undefined (e.g. empty_reference_mask)")
    pf_status: str | None = Field(None, description="'ok' or why PF is undefined")
    prompt_empty: bool | None = Field(None, description="the prompt is empty after stripping the subject name")
    prompt_text: str | None = Field(None, description="the text PF was scored against (after stripping)")
    prompt_stripped: bool | None = Field(None, description="the subject name was stripped from the prompt")
    prompt_truncated: bool | None = Field(None, description="the text was cut to the text tower's token length")
    cp_n_ref_fg: int | None = Field(None, description="reference patches under the mask (CP's mean is over these)")
    cp_n_ref_total: int | None = Field(None, description="reference patches in all")
    pf_n_bg_pooled: int | None = Field(None, description="output patches pooled for PF (the background)")
    pf_n_total: int | None = Field(None, description="output patches in all")
    ref_mask_coverage: float | None = Field(None, description="foreground fraction of the reference mask, [0, 1]")
    out_mask_coverage: float | None = Field(None, description="foreground fraction of the output mask, [0, 1]")
    ref_mask_source: str | None = Field(None, description="with a segmenter: 'file' or 'segmenter'")
    out_mask_source: str | None = Field(None, description="with a segmenter: 'file' or 'segmenter'")


#: The record's declared fields (CP, PF and masc-run's diagnostics).
_BuiltinScoreResult = ScoreResult


def _metric_fields() -> dict:
    """Fields for the registered pair metrics every run computes (runtime/pair_metrics) that the
    record above does not declare: each value column (null where undefined) and its status."""
    fields: dict = {}
    for m in score_metrics():
        for c in m.columns:
            if c not in _BuiltinScoreResult.model_fields:
                fields[c] = (float | None, Field(None, description=f"{m.name}: {m.description}"))
        if m.status_column and m.status_column not in _BuiltinScoreResult.model_fields:
            fields[m.status_column] = (str | None, Field(None, description=f"'ok' or why {m.name} is undefined"))
    return fields


def _score_result() -> type[BaseModel]:
    """:class:`_BuiltinScoreResult` with the registered metrics' fields (the class itself when there are none,
    so the built-in document is unchanged)."""
    extra = _metric_fields()
    if not extra:
        return _BuiltinScoreResult
    return create_model("ScoreResult", __base__=_BuiltinScoreResult, __doc__=_BuiltinScoreResult.__doc__, **extra)


#: The response record of a scored pair, every registered metric's columns typed.
ScoreResult = _score_result()  # type: ignore[misc, assignment]  # the class above, or its subclass built at import


class BatchResult(BaseModel):
    results: list[ScoreResult]


def _opted_fields(metrics) -> dict:
    """Fields for the opt-in metrics a server computes (``masc-serve --metrics``): each value
    column (null where undefined) and its status."""
    fields: dict = {}
    for m in metrics:
        if m.option is None:
            continue
        fields.update({c: (float | None, Field(None, description=f"{m.name}: {m.description}")) for c in m.columns})
        if m.status_column:
            fields[m.status_column] = (
                str | None,
                Field(None, description=f"'ok' or why {m.name} is undefined ({', '.join(m.statuses)})"),
            )
    return fields


def result_models(metrics=()) -> tuple[type[BaseModel], type[BaseModel]]:
    """``(record model, batch model)`` of a server computing ``metrics`` (the pair metrics of its
    ``RunSettings.run_metrics()``): :class:`ScoreResult` and :class:`BatchResult` with each opt-in
    metric's columns typed (the classic ones, ``--metrics clip_i,...``), named as the originals so
    the OpenAPI document keeps its references; the originals themselves for a server without."""
    extra = _opted_fields(metrics)
    if not extra:
        return ScoreResult, BatchResult
    record = create_model("ScoreResult", __base__=ScoreResult, __doc__=ScoreResult.__doc__, **extra)
    batch = create_model("BatchResult", __base__=BaseModel, results=(list[record], ...))  # type: ignore[valid-type]  # built at run time
    return record, batch


class ErrorBody(BaseModel):
    error: str = Field(description="machine-readable reason, e.g. missing_field, bad_base64, unreadable_image")
    field: str | None = Field(description="the request field at fault, e.g. 'ref_image' or 'items[2].prompt'")
    detail: str = Field(description="one line: what is wrong and why")


#: The error answers every scoring route documents.
ERRORS: dict[int | str, dict[str, Any]] = {c: {"model": ErrorBody} for c in (400, 408, 413, 415, 422, 500, 503)}


def multipart_schema(masks_optional: bool = False) -> dict:
    """The ``multipart/form-data`` body of ``/v1/score`` (the masks optional with a segmenter)."""
    files = {f: {"type": "string", "format": "binary"} for f in BYTE_FIELDS}
    required = [f for f in BYTE_FIELDS if not (masks_optional and f in MASK_FIELDS)]
    return {
        "type": "object",
        "required": [*required, "prompt"],
        "properties": {
            **files,
            "prompt": {"type": "string"},
            "object_name": {"type": "string"},
            "stripper": {"type": "string", "enum": list(STRIPPERS)},
        },
    }


def add_schemas(app: FastAPI, strippers: tuple[str, ...], cfg) -> None:
    """Put the request models into the OpenAPI components (the routes read their bodies
    themselves, to accept JSON and multipart on one path and to name fields in errors), with
    ``stripper`` limited to the strippers this server enables and the text fields' length to
    the prompt budget (``maxLength`` counts characters, the budget bytes: a longer text is
    surely over it)."""
    base = app.openapi

    def openapi():
        if app.openapi_schema:
            return app.openapi_schema
        schema = base()
        comps = schema.setdefault("components", {}).setdefault("schemas", {})
        for model in request_models(cfg.segmenter is not None):
            s = model.model_json_schema(ref_template="#/components/schemas/{model}")
            for k, v in s.pop("$defs", {}).items():
                comps.setdefault(k, v)
            comps[model.__name__] = s
        multipart = schema["paths"]["/v1/score/upload"]["post"]["requestBody"]["content"]["multipart/form-data"][
            "schema"
        ]
        for prop in (comps["ScoreItem"]["properties"]["stripper"], multipart["properties"]["stripper"]):
            for alt in [prop, *prop.get("anyOf", [])]:
                if "enum" in alt:
                    alt["enum"] = list(strippers)
        for props in (comps["ScoreItem"]["properties"], multipart["properties"]):
            for name in ("prompt", "object_name"):
                for alt in [props[name], *props[name].get("anyOf", [])]:
                    if alt.get("type") == "string":
                        alt["maxLength"] = cfg.max_prompt_bytes
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way to extend the document
