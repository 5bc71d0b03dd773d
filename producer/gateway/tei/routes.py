"""text-embeddings-inference's API on the gateway: POST /embed, /embed_all, /similarity, POST / (TEI's default
route, here chosen by the body) and GET /info, answered by the fleet's workers like every other route.

What TEI decides in its router is decided here the same way: `normalize` and `dimensions` (TEI cuts any
model's vector, then normalises), cosine similarity, and TEI's error body `{"error", "error_type"}`. Statuses
still come from the gateway's one table (producer/gateway/core/errors.py), so a few differ from TEI's; docs/tei.md
lists them.
"""

from __future__ import annotations

import importlib.metadata
import re
import time
from typing import Annotated

import numpy as np
from fastapi import APIRouter, Body, Depends, Query
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from pydantic import ValidationError as PydanticValidationError

from embedfleet.common.capabilities import ModelCapabilities
from embedfleet.common.errors import EmbedfleetError, ValidationError, invalid_request
from embedfleet.common.result import Result
from embedfleet.producer.client.core import pick_model
from embedfleet.producer.gateway.core.auth import admit, require_key
from embedfleet.producer.gateway.core.errors import shape_errors
from embedfleet.producer.gateway.core.service import Gateway, gateway
from embedfleet.producer.gateway.tei.paths import tei_model
from embedfleet.producer.gateway.tei.schemas import (EmptyInputError, SimilarityParameters, TeiEmbedAllBody,
                                                     TeiEmbedBody, TeiEmbedSparseBody, TeiSimilarityBody, tei_inputs)

router = APIRouter(dependencies=[Depends(require_key)])
SUBMITS = [Depends(admit)]  # the routes that hold a request against the key's rate and share

PATHS = ("/", "/embed", "/embed_all", "/embed_sparse", "/similarity", "/info")

# Our error codes as TEI's ErrorType (serialised by TEI as the variant's name). TEI has no type for a refused
# key (it answers a bare 401): "Unauthorized" is ours.
_TYPES = {"invalid_request": "Validation", "input_too_long": "Validation", "decode_error": "Validation",
          "model_not_found": "Validation", "payload_too_large": "Validation",
          "result_too_large": "Validation", "not_found": "Validation",
          "method_not_allowed": "Validation", "queue_full": "Overloaded", "rate_limited": "Overloaded",
          "no_worker": "Unhealthy", "redis_unavailable": "Unhealthy", "unauthorized": "Unauthorized"}
_INPUT_ERRORS = {"invalid_request", "input_too_long", "decode_error"}  # TEI's "Input validation error: ..."
# The worker's too-long message (worker/engine/preprocess.py), read for TEI's wording; another wording falls
# back to the worker's own message.
_TOO_LONG = re.compile(r"has (\d+) tokens, more than the (?:maximum|max_embed_len) (\d+)")


def tei_error(err: EmbedfleetError, status: int, kind: str) -> dict:
    """TEI's ErrorResponse: `{"error": message, "error_type": "Validation" | "Empty" | ...}`."""
    error_type = "Empty" if isinstance(err, EmptyInputError) else _TYPES.get(err.code, "Backend")
    message = err.message
    if err.code == "input_too_long" and (found := _TOO_LONG.search(message)):
        message = f"`inputs` must have less than {found.group(2)} tokens. Given: {found.group(1)}"
    if err.code in _INPUT_ERRORS:
        message = f"Input validation error: {message}"
    return {"error": message, "error_type": error_type}


shape_errors(PATHS, tei_error)


@router.post("/embed", dependencies=SUBMITS)
async def embed(body: TeiEmbedBody, gw: Gateway = Depends(gateway)) -> JSONResponse:
    """One pooled vector per input, as a bare list of lists."""
    started = time.monotonic()
    vectors, result, chars = await _embed(gw, body)
    return _answer(vectors.tolist(), result, chars, started)


@router.post("/embed_all", dependencies=SUBMITS)
async def embed_all(body: TeiEmbedAllBody, gw: Gateway = Depends(gateway)) -> JSONResponse:
    """Every token's vector (the fleet's token_embed task), special tokens included, not normalised."""
    started = time.monotonic()
    inputs = tei_inputs(body.inputs)
    caps = await _model(gw, body.model, len(inputs))
    result = await gw.run_task(inputs, caps.name, "token_embed",
                               {**body.truncation_fields(), "use_activation": False})
    return _answer([rows.tolist() for rows in result.multi_vectors], result, _chars(inputs), started)


@router.post("/embed_sparse", dependencies=SUBMITS)
async def embed_sparse(body: TeiEmbedSparseBody, gw: Gateway = Depends(gateway)) -> JSONResponse:
    """One sparse vector per input, as TEI shapes it: the non-zero values as [{index, value}], ids ascending."""
    started = time.monotonic()
    inputs = tei_inputs(body.inputs)
    caps = await _model(gw, body.model, len(inputs))
    options = {k: v for k, v in (("sparse_top_k", body.sparse_top_k), ("sparse_threshold", body.sparse_threshold))
               if v is not None}
    result = await gw.run_task(inputs, caps.name, "sparse_embed", {**body.truncation_fields(), **options})
    vectors = [[{"index": int(i), "value": float(v)} for i, v in zip(*vector)] for vector in result.sparse]
    return _answer(vectors, result, _chars(inputs), started)


@router.post("/similarity", dependencies=SUBMITS)
async def similarity(body: TeiSimilarityBody, gw: Gateway = Depends(gateway)) -> JSONResponse:
    """The cosine similarity of `source_sentence` with each of `sentences`."""
    started = time.monotonic()
    scores, result, chars = await _similarity(gw, body)
    return _answer(scores, result, chars, started)


@router.post("/", dependencies=SUBMITS)
async def default_route(data: Annotated[dict, Body()], gw: Gateway = Depends(gateway)) -> JSONResponse:
    """TEI's `POST /` serves its model's task; here the body says which: `inputs` holding `source_sentence`
    is a similarity request (huggingface_hub's sentence_similarity), anything else an /embed request
    (feature_extraction). Both clients post to the bare URL they were given."""
    started = time.monotonic()
    if isinstance(data.get("inputs"), dict):
        scores, result, chars = await _similarity(gw, _parse(TeiSimilarityBody, data))
        return _answer(scores, result, chars, started)
    vectors, result, chars = await _embed(gw, _parse(TeiEmbedBody, data))
    return _answer(vectors.tolist(), result, chars, started)


@router.get("/info")
async def info(model: str | None = Query(None, description="the served model to describe; omitted: the only "
                                                            "served model"),
               gw: Gateway = Depends(gateway)) -> JSONResponse:
    """TEI's Info, filled from the model's capability advert and its live workers' adverts (the facts behind
    /v1/models). model_sha, sha and docker_label are always null; model_id is the served name."""
    caps = pick_model(tei_model(model, gw.settings.tei_model), await gw.producer.models(),
                      gw.producer.known_models())
    workers = await gw.producer.workers(caps.name)
    dtypes = sorted({w["dtype"] for w in workers if "dtype" in w})
    return JSONResponse({
        "model_id": caps.name,
        "model_sha": None,
        "model_dtype": ",".join(dtypes) or "unknown",
        "served_model_name": caps.name,
        "model_type": _model_type(caps),
        "max_concurrent_requests": gw.settings.max_in_flight,
        "max_input_length": caps.max_model_len,
        "max_batch_tokens": max((w.get("max_batch_tokens", 0) for w in workers), default=0),
        "max_batch_requests": max((w["max_batch_size"] for w in workers if "max_batch_size" in w), default=None),
        "max_client_batch_size": min(gw.settings.max_inputs, caps.max_inputs),
        "auto_truncate": False,
        "tokenization_workers": len(workers),
        "version": importlib.metadata.version("embedfleet"),
        "sha": None,
        "docker_label": None,
    })


async def _embed(gw: Gateway, body: TeiEmbedBody) -> tuple[np.ndarray, Result, int]:
    """TEI's embed: pool, cut to `dimensions`, then normalise if asked. The cut is made here for any model
    (the fleet cuts Matryoshka models only), so the fleet is asked for the whole vector, not normalised."""
    inputs = tei_inputs(body.inputs)
    caps = await _model(gw, body.model, len(inputs))
    cut = body.dimensions if body.dimensions not in (None, caps.embedding_size) else None
    if cut is not None and cut > caps.embedding_size:
        raise ValidationError(f"`dimensions` should be smaller than the maximum embedding dimension: model "
                              f"'{caps.name}' has {caps.embedding_size}, allowed is 1 to {caps.embedding_size}",
                              param="dimensions")
    fields = {**body.truncation_fields(), "use_activation": body.normalize and cut is None}
    result = await gw.run_task(inputs, caps.name, "embed", fields)
    vectors = result.embeddings
    if cut is not None:
        vectors = vectors[:, :cut]
        if body.normalize:
            vectors = _unit(vectors)
    return vectors, result, _chars(inputs)


async def _similarity(gw: Gateway, body: TeiSimilarityBody) -> tuple[list[float], Result, int]:
    if not body.inputs.sentences:
        raise EmptyInputError("`inputs.sentences` cannot be empty", param="inputs")
    texts = tei_inputs([body.inputs.source_sentence, *body.inputs.sentences])
    caps = await _model(gw, body.model, len(texts))
    options = (body.parameters or SimilarityParameters()).truncation_fields()
    result = await gw.run_task(texts, caps.name, "embed", {**options, "use_activation": True})
    vectors = _unit(result.embeddings.astype(np.float64))
    return [float(s) for s in vectors[1:] @ vectors[0]], result, _chars(texts)


async def _model(gw: Gateway, model: str | None, count: int) -> ModelCapabilities:
    """The model asked for (by the body, the path or --tei-model; else the only one served), with TEI's check of
    the batch size."""
    caps = pick_model(tei_model(model, gw.settings.tei_model), await gw.producer.models(),
                      gw.producer.known_models())
    limit = min(gw.settings.max_inputs, caps.max_inputs)
    if count > limit:
        raise ValidationError(f"batch size {count} > maximum allowed batch size {limit}", param="inputs")
    return caps


def _unit(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length; an all-zero row stays zero (TEI's normalisation divides by max(norm, eps))."""
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return (vectors / np.maximum(norms, 1e-12)).astype(vectors.dtype)


def _chars(inputs) -> int:
    """TEI's x-compute-characters: characters of the texts, or the number of token ids."""
    return sum(len(item) for item in inputs)


def _answer(content, result: Result, chars: int, started: float) -> JSONResponse:
    """The JSON answer with TEI's x-compute-* headers (the times TEI splits into tokenization, queue and
    inference happen on a worker: only the total is known here)."""
    elapsed = str(int((time.monotonic() - started) * 1000))
    return JSONResponse(content, headers={"x-compute-type": "embedfleet", "x-compute-time": elapsed,
                                          "x-total-time": elapsed, "x-compute-characters": str(chars),
                                          "x-compute-tokens": str(result.usage.prompt_tokens)})


def _model_type(caps: ModelCapabilities) -> dict:
    """TEI's ModelType: embedding (with its pooling; SPLADE's is "splade"), reranker (a one-label cross-encoder) or
    classifier."""
    if "embed" in caps.tasks:
        return {"embedding": {"pooling": caps.pooling}}
    if "sparse_embed" in caps.tasks:  # a SPLADE model: TEI's embedding model with pooling "splade"
        return {"embedding": {"pooling": "splade"}}
    labels = {str(i): label for i, label in enumerate(caps.labels)}
    kind = "reranker" if "score" in caps.tasks and len(caps.labels) <= 1 else "classifier"
    return {kind: {"id2label": labels, "label2id": {label: i for i, label in enumerate(caps.labels)}}}


def _parse(cls: type[BaseModel], data):
    try:
        return cls.model_validate(data)
    except PydanticValidationError as exc:  # the same messages as a typed body's (producer/gateway/core/errors.py)
        raise invalid_request(exc.errors(), cls.known_fields()) from exc
