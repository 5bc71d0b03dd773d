"""SageMaker's routes: `POST /invocations` answers the body with the route whose request schema it fits, as vLLM
does (embeddings, classify, rerank, score, pooling, in that order, each only where the body's model serves
its task), and `/ping` is /health.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Depends
from fastapi.responses import Response
from pydantic import BaseModel
from pydantic import ValidationError as PydanticValidationError

from embedfleet.common.errors import EmbedfleetError, ValidationError
from embedfleet.producer.client.core import pick_model
from embedfleet.producer.gateway.core.auth import admit, require_key
from embedfleet.producer.gateway.core.schemas import EmbedBody
from embedfleet.producer.gateway.core.service import Gateway, gateway
from embedfleet.producer.gateway.fleet import routes as fleet
from embedfleet.producer.gateway.openai import routes as openai
from embedfleet.producer.gateway.tasks import routes as taskroutes
from embedfleet.producer.gateway.tasks.schemas import ClassifyBody, RerankBody, ScoreBody
from embedfleet.producer.gateway.vllm import routes as vllm
from embedfleet.producer.gateway.vllm.schemas import PoolingBody

public = APIRouter()
router = APIRouter(dependencies=[Depends(require_key), Depends(admit)])

# (vLLM's request type, our body, the tasks a model needs for it, the route answering it). Earlier wins:
# vLLM's order, so that a body fitting several (`{"input": ...}` fits embeddings, classify and pooling) goes
# where vLLM sends it for that model.
HANDLERS: tuple[tuple[str, type[BaseModel], frozenset[str], str], ...] = (
    ("EmbeddingRequest", EmbedBody, frozenset({"embed"}), "/v1/embeddings"),
    ("ClassificationRequest", ClassifyBody, frozenset({"classify"}), "/classify"),
    ("RerankRequest", RerankBody, frozenset({"score"}), "/rerank"),
    ("ScoreRequest", ScoreBody, frozenset({"score"}), "/score"),
    ("PoolingRequest", PoolingBody, frozenset({"embed", "token_embed", "classify"}), "/pooling"),
)


async def _answer(name: str, data: dict, body: BaseModel, gw: Gateway) -> Response:
    if name == "EmbeddingRequest":
        return await openai.create_embeddings(body, gw)
    if name == "ClassificationRequest":
        return await taskroutes.classify(body, gw)
    if name == "RerankRequest":
        return await taskroutes.rerank(data, gw)
    if name == "ScoreRequest":
        return await taskroutes.score(body, gw)
    return await vllm.create_pooling(body, gw)


async def _tasks(gw: Gateway, data: dict) -> tuple[str, ...] | None:
    """The tasks of the body's model (or the only served one); None when that cannot be known here, and
    then every handler is tried (the one picked answers the model's error)."""
    model = data.get("model")
    if model is not None and not isinstance(model, str):
        return None
    try:
        return pick_model(model, await gw.producer.models(refresh=False)).tasks
    except EmbedfleetError:
        return None


@router.post("/invocations")
async def invocations(data: Annotated[object, Body()], gw: Gateway = Depends(gateway)) -> Response:
    """The first handler whose body this is (vLLM's order), among those the model serves."""
    tasks = await _tasks(gw, data) if isinstance(data, dict) else None
    offered = [h for h in HANDLERS if tasks is None or h[2] & set(tasks)]
    if isinstance(data, dict):
        for name, schema, _, _ in offered:
            try:
                body = schema.model_validate(data)
            except PydanticValidationError:
                continue
            return await _answer(name, data, body, gw)
    names = [name for name, *_ in offered]
    routes_ = ", ".join(f"{route} ({name})" for name, _, _, route in offered)
    raise ValidationError(f"Cannot find suitable handler for request. Expected one of: {names}: the body of one "
                          f"of {routes_}" + (f", the routes of what the model serves ({list(tasks)})" if tasks else ""),
                          param="body")


@public.get("/ping")
@public.post("/ping")
async def ping(gw: Gateway = Depends(gateway)) -> Response:
    """SageMaker's health check: /health's answer (200 with a live worker, else 503)."""
    return await fleet.health(gw)
