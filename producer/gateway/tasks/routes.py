"""The task routes: /score, /rerank, /classify, /tokenize, /detokenize, /decode (and their /v1, /v2 aliases).

Each one is a request of its task on the model's queue, answered by a worker (the gateway holds no model
and no tokenizer). A task the model does not serve fails at submit, naming the tasks it does.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Depends
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from pydantic import ValidationError as PydanticValidationError

from embedfleet.common.errors import invalid_request
from embedfleet.common.result import Result
from embedfleet.producer.gateway.core.auth import admit, require_key
from embedfleet.producer.gateway.core.errors import shape_errors, vllm_and_cohere_shape, vllm_shape
from embedfleet.producer.gateway.core.service import Gateway, gateway
from embedfleet.producer.gateway.tei.paths import tei_model
from embedfleet.producer.gateway.tasks.schemas import (ClassifyBody, DetokenizeBody, RerankBody, ScoreBody,
                                                       TeiDecodeBody, TeiRerankBody, TeiTokenizeBody, TokenizeBody,
                                                       pick)
from embedfleet.producer.client.tasks import check_rerank, rank, score_pairs

router = APIRouter(dependencies=[Depends(require_key), Depends(admit)])  # every route here submits

# vLLM's routes answer errors in vLLM's body (type BadRequestError, code 400); /v1/embeddings keeps OpenAI's.
VLLM_PATHS = ("/pooling", "/score", "/v1/score", "/rerank", "/v1/rerank", "/classify", "/tokenize", "/detokenize")
shape_errors(VLLM_PATHS, vllm_shape)
shape_errors(("/v2/rerank",), vllm_and_cohere_shape)


def _parse(cls: type[BaseModel], data):
    try:
        return cls.model_validate(data)
    except PydanticValidationError as exc:  # the same messages as every other body
        raise invalid_request(exc.errors(), cls.known_fields()) from exc


def _usage(result: Result) -> dict:
    return {"prompt_tokens": result.usage.prompt_tokens, "total_tokens": result.usage.total_tokens,
            "completion_tokens": 0}


def _head(result: Result) -> dict:
    return {"id": result.id, "object": "list", "created": int(result.finished_at), "model": result.model}


@router.post("/score")
@router.post("/v1/score")
async def score(body: ScoreBody, gw: Gateway = Depends(gateway)) -> JSONResponse:
    firsts, seconds = score_pairs(body.text_1, body.text_2)
    result = await gw.run_task(firsts, body.model, "score", body.param_fields(), text_pair=seconds)
    return JSONResponse({**_head(result), "usage": _usage(result), "data": [
        {"index": i, "object": "score", "score": float(s)} for i, s in enumerate(result.scores)]})


@router.post("/rerank")
@router.post("/v1/rerank")
@router.post("/v2/rerank")
async def rerank(data: Annotated[dict, Body()], gw: Gateway = Depends(gateway)) -> JSONResponse:
    """vLLM / Cohere / Jina shape; TEI's (`texts`) on the same paths answers TEI's list."""
    body = _parse(pick(data, "texts", RerankBody, TeiRerankBody), data)
    tei = isinstance(body, TeiRerankBody)
    documents = check_rerank(body.query, body.texts if tei else body.documents, None if tei else body.top_n)
    model = tei_model(body.model, gw.settings.tei_model) if tei else body.model
    result = await gw.run_task([body.query] * len(documents), model, "score", body.param_fields(),
                               text_pair=documents)
    if tei:
        return JSONResponse([{"index": r["index"], "score": r["relevance_score"],
                              **({"text": documents[r["index"]]} if body.return_text else {})}
                             for r in rank(result.scores, documents)])
    # vLLM's RerankResponse usage: prompt and total tokens (clients typed on it require prompt_tokens)
    usage = {"prompt_tokens": result.usage.prompt_tokens, "total_tokens": result.usage.total_tokens}
    return JSONResponse({"id": result.id, "model": result.model, "usage": usage,
                         "results": rank(result.scores, documents, body.top_n, body.return_documents)})


@router.post("/classify")
async def classify(body: ClassifyBody, gw: Gateway = Depends(gateway)) -> JSONResponse:
    result = await gw.run_task(body.input, body.model, "classify", {**body.param_fields(), **body.chat_fields()})
    labels = list(result.labels)
    return JSONResponse({**_head(result), "usage": _usage(result), "data": [
        {"index": i, "label": labels[int(row.argmax())] if labels else None, "probs": row.tolist(),
         "num_classes": len(row)} for i, row in enumerate(result.scores)]})


@router.post("/tokenize")
async def tokenize(data: Annotated[dict, Body()], gw: Gateway = Depends(gateway)) -> JSONResponse:
    """vLLM's {count, max_model_len, tokens}; TEI's (`inputs`) list of {id, text, special, start, stop}."""
    body = _parse(pick(data, "inputs", TokenizeBody, TeiTokenizeBody), data)
    if isinstance(body, TeiTokenizeBody):
        texts = [body.inputs] if isinstance(body.inputs, str) else body.inputs
        result = await gw.run_task(texts, tei_model(body.model, gw.settings.tei_model), "tokenize",
                                   body.param_fields())
        return JSONResponse([[{"id": i, "text": t, "special": s, "start": o[0] if o else None,
                               "stop": o[1] if o else None}
                              for i, t, s, o in zip(item["ids"], item["tokens"], item["special"],
                                                    item["offsets"] or [None] * len(item["ids"]))]
                             for item in result.items])
    result = await gw.run_task([body.prompt], body.model, "tokenize", body.param_fields())
    item = result.items[0]
    caps = (await gw.producer.models()).get(result.model)
    return JSONResponse({"count": len(item["ids"]), "max_model_len": caps.max_model_len if caps else None,
                         "tokens": item["ids"], **({"token_strs": item["tokens"]} if body.return_token_strs else {})})


@router.post("/detokenize")
async def detokenize(body: DetokenizeBody, gw: Gateway = Depends(gateway)) -> JSONResponse:
    result = await gw.run_task([body.tokens], body.model, "detokenize", body.param_fields())
    return JSONResponse({"prompt": result.items[0]})


@router.post("/decode")
async def decode(body: TeiDecodeBody, gw: Gateway = Depends(gateway)) -> JSONResponse:
    """TEI's /decode: a list of texts, one per id list."""
    ids = [body.ids] if body.ids and isinstance(body.ids[0], int) else body.ids
    result = await gw.run_task(ids, tei_model(body.model, gw.settings.tei_model), "detokenize", body.param_fields())
    return JSONResponse(result.items)
