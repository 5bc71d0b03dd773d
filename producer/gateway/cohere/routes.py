"""Cohere's embed API, `POST /v2/embed`, as vLLM serves it: `texts` (or text-only `inputs`), `input_type` -> the
model's prompt of that name, several `embedding_types` from one request to the fleet, `output_dimension`,
`truncate` NONE / START / END with `max_tokens`; Cohere's response and error bodies.

The fleet computes float32 vectors once; every other type is derived here with the fleet's own casts
(common/quantize.py), so int8 / uint8 / binary / ubinary equal what `embed_dtype` gives for the same request.
"""

from __future__ import annotations

import asyncio
import base64
import uuid
from typing import Literal

import numpy as np
from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic import ValidationError as PydanticValidationError

from embedfleet.common.bounds import MAX_TOKENS, FailFastList, bounded_int
from embedfleet.common.capabilities import ModelCapabilities
from embedfleet.common.codec import unencodable
from embedfleet.common.errors import EmbedfleetError, InputTooLongError, ValidationError, echo, invalid_request
from embedfleet.common.params import Dimensions
from embedfleet.common.quantize import PACKED, quantize
from embedfleet.common.result import Result
from embedfleet.producer.client.core import pick_model
from embedfleet.producer.gateway.core import chat, errors
from embedfleet.producer.gateway.core.auth import admit, require_key
from embedfleet.producer.gateway.core.schemas import EmbedBody, Priority
from embedfleet.producer.gateway.core.service import Gateway, gateway

EmbeddingType = Literal["float", "int8", "uint8", "binary", "ubinary", "base64"]
MaxTokens = bounded_int("`max_tokens`", 1, MAX_TOKENS, f"a positive number of tokens, at most {MAX_TOKENS}")
PATHS = ("/v2/embed",)

router = APIRouter(dependencies=[Depends(require_key), Depends(admit)])


class CohereInput(BaseModel):
    """One Cohere `inputs` entry: its parts are the chat text parts (`image_url` ones are refused)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    content: FailFastList[chat.TextPart] = Field(min_length=1)


class CohereEmbedBody(BaseModel):
    """Cohere's v2 EmbedRequest (vLLM's CohereEmbedRequest plus int8 / uint8)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str | None = Field(None, description="served model name; omitted: the only served model")
    input_type: str | None = Field(None, description="the name of one of the model's prompts (its "
                                                     "sentence-transformers `prompts`), prepended to each text")
    texts: FailFastList[str] | None = Field(None, min_length=1)
    images: FailFastList[str] | None = Field(None, description="refused: the fleet embeds text only")
    inputs: FailFastList[CohereInput] | None = Field(None, min_length=1, description="text-only inputs, each "
                                                     "rendered as one user message with the model's chat template (as "
                                                     "vLLM)")
    output_dimension: Dimensions | None = Field(None, description="Matryoshka `dimensions`")
    embedding_types: FailFastList[EmbeddingType] | None = Field(None, min_length=1, description="default: [\"float\"]")
    truncate: Literal["NONE", "START", "END"] = Field(
        "END", description="END / START: cut an input that is too long at its end / its start; NONE: refuse it")
    max_tokens: MaxTokens | None = Field(None, description="the most tokens embedded per input")
    priority: Priority | None = None

    @classmethod
    def known_fields(cls) -> tuple[str, ...]:
        return tuple(cls.model_fields)

    @model_validator(mode="before")
    @classmethod
    def _unicode(cls, data):
        """JSON's "\\ud800" decodes to a lone surrogate, which no request can carry: refused, naming the field."""
        if isinstance(data, dict):
            for name, value in data.items():
                if found := unencodable(value):
                    raise ValueError(f"`{name}` must be valid Unicode text, found {found}")
        return data


def cohere_error(err: EmbedfleetError, status: int, kind: str) -> dict:
    """Cohere's error body (`message`, the client shows it), with vLLM's `error` object beside it so that a
    client written against vLLM's /v2/embed (`error.message`) reads it too."""
    vllm_type = {400: "BadRequestError", 404: "NotFoundError"}.get(status, kind)
    return {"id": str(uuid.uuid4()), "message": err.message,
            "error": {"message": err.message, "type": vllm_type, "param": err.param, "code": status}}


errors.shape_errors(PATHS, cohere_error)


def truncation(body: CohereEmbedBody) -> dict:
    """Cohere's `truncate` + `max_tokens` as PoolingParams fields (vLLM's mapping; END names its side, since
    Cohere's END means "cut the end" whatever the tokenizer's own default side)."""
    if body.truncate == "NONE":
        return {}
    keep = body.max_tokens if body.max_tokens is not None else -1
    return {"truncate_prompt_tokens": keep, "truncation_side": "left" if body.truncate == "START" else "right"}


def check_against(body: CohereEmbedBody, caps: ModelCapabilities, types: list[str]) -> None:
    """What needs the model's capabilities, refused with Cohere's names before anything is queued."""
    if body.input_type is not None and body.input_type not in caps.prompts:
        if not caps.prompts:
            raise ValidationError(f"Unsupported input_type {echo(repr(body.input_type))}. This model does not define "
                                  "any input_type task instructions (sentence-transformers prompts): omit input_type",
                                  param="input_type")
        raise ValidationError(f"Unsupported input_type {echo(repr(body.input_type))}. Supported values: "
                              f"{', '.join(sorted(caps.prompts))}", param="input_type")
    if body.max_tokens is not None and body.truncate != "NONE" and body.max_tokens > caps.max_model_len:
        raise ValidationError(f"`max_tokens`={body.max_tokens} exceeds the max length {caps.max_model_len} of "
                              f"model '{caps.name}': allowed is 1 to {caps.max_model_len}", param="max_tokens")
    width = body.output_dimension or caps.embedding_size
    packed = [t for t in types if t in PACKED]
    if packed and width % 8:
        raise ValidationError(f"Embedding dimension must be a multiple of 8 for binary embedding types, but got "
                              f"{width}: ask for {packed[0]} with an output_dimension that is a multiple of 8, or "
                              "for float / int8 / uint8 / base64", param="embedding_types")


def typed_embeddings(vectors: np.ndarray, types: list[str]) -> dict:
    """Each requested type from the one float32 answer: int8 / uint8 over the request's rows (as the fleet's
    embed_dtype), binary / ubinary packed, base64 of little-endian float32 (Cohere's and vLLM's)."""
    out: dict[str, list] = {}
    for kind in dict.fromkeys(types):
        if kind == "float":
            out[kind] = vectors.tolist()
        elif kind == "base64":
            out[kind] = [base64.b64encode(row.astype("<f4").tobytes()).decode("ascii") for row in vectors]
        else:
            out[kind] = quantize(vectors, kind).tolist()
    return out


async def _caps(gw: Gateway, model: str | None) -> ModelCapabilities | None:
    """The model's advertised capabilities, or None where they cannot be had (submit then raises why)."""
    try:
        return pick_model(model, await gw.producer.models(refresh=False))
    except EmbedfleetError:
        return None


async def _check_lengths(gw: Gateway, texts: list[str], body: CohereEmbedBody) -> None:
    """truncate NONE with max_tokens: no input may have more tokens than that (the fleet tokenises; nothing
    is embedded when one is too long)."""
    result = await gw.run_task(texts, body.model, "tokenize", {})
    for index, item in enumerate(result.items):
        if len(item["ids"]) > body.max_tokens:
            raise InputTooLongError(f"input {index} has {len(item['ids'])} tokens, more than max_tokens="
                                    f"{body.max_tokens}; with truncate NONE nothing is cut: shorten it, or send "
                                    "truncate END or START", param="texts")


@router.post("/v2/embed")
async def embed(body: CohereEmbedBody, gw: Gateway = Depends(gateway)) -> JSONResponse:
    given = [name for name in ("texts", "images", "inputs") if getattr(body, name) is not None]
    if len(given) != 1:
        raise ValidationError("send exactly one of `texts` or `inputs` (got "
                              f"{' and '.join(given) or 'neither'})", param="texts")
    if body.images is not None:
        raise ValidationError("`images` cannot be embedded: this fleet serves text models; send `texts`",
                              param="images")
    types = list(body.embedding_types or ["float"])
    caps = await _caps(gw, body.model)
    if caps is not None:
        check_against(body, caps, types)
    common = {"model": body.model, "dimensions": body.output_dimension, "priority": body.priority,
              **truncation(body)}
    if body.texts is not None:
        if body.truncate == "NONE" and body.max_tokens is not None:
            prompt = caps.prompts.get(body.input_type, "") if caps and body.input_type else ""
            await _check_lengths(gw, [prompt + text for text in body.texts], body)
        result = await gw.run(_body(input=body.texts, prompt_name=body.input_type, **common))
        return _answer(result.id, [result], types, body.texts)
    if len(body.inputs) > gw.settings.max_inputs:  # one fleet request each: bounded as a request's inputs are
        raise ValidationError(f"{len(body.inputs)} inputs in one request; this gateway allows at most "
                              f"{gw.settings.max_inputs} (split the request)", param="inputs")
    prefix = caps.prompts.get(body.input_type) if caps and body.input_type else None
    bodies = [_body(messages=chat.cohere_messages([part.text for part in item.content], prefix), **common)
              for item in body.inputs]
    results = await asyncio.gather(*(gw.run(one) for one in bodies))
    if body.truncate == "NONE" and body.max_tokens is not None:  # one request per input: its usage is its length
        for index, result in enumerate(results):
            if result.usage.prompt_tokens > body.max_tokens:
                raise InputTooLongError(f"input {index} has {result.usage.prompt_tokens} tokens (rendered with the "
                                        f"chat template), more than max_tokens={body.max_tokens}; with truncate NONE "
                                        "nothing is cut: shorten it, or send truncate END or START", param="inputs")
    return _answer(results[0].id, results, types, None)


def _body(**fields) -> EmbedBody:
    """The embeddings body of the same request, refused with the usual 400 where a value does not fit it (a text
    that is no valid Unicode)."""
    try:
        return EmbedBody(**fields)
    except PydanticValidationError as exc:
        raise invalid_request(exc.errors()) from exc


def _answer(request_id: str, results: list[Result], types: list[str], texts: list[str] | None) -> JSONResponse:
    vectors = np.concatenate([np.asarray(r.embeddings, dtype=np.float32) for r in results])
    tokens = sum(r.usage.prompt_tokens for r in results)
    return JSONResponse({
        "id": request_id, "embeddings": typed_embeddings(vectors, types),
        **({"texts": texts} if texts is not None else {}),
        "meta": {"api_version": {"version": "2"}, "billed_units": {"input_tokens": tokens},
                 "tokens": {"input_tokens": tokens}},
        "response_type": "embeddings_by_type",
    })
