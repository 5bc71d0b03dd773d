"""OpenAI's embeddings API: POST /v1/embeddings (the `openai` client's embeddings.create)."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.responses import Response

from embedfleet.producer.gateway.core import encoding
from embedfleet.producer.gateway.core.auth import admit, require_key
from embedfleet.producer.gateway.core.schemas import EmbedBody
from embedfleet.producer.gateway.core.service import Gateway, gateway

router = APIRouter(dependencies=[Depends(require_key)])


@router.post("/v1/embeddings", dependencies=[Depends(admit)])
async def create_embeddings(body: EmbedBody, gw: Gateway = Depends(gateway)) -> Response:
    body.dense_only("/v1/embeddings")
    result = await gw.run(body)
    return encoding.embeddings_response(result, body.encoding_format, body.explicit_layout)
