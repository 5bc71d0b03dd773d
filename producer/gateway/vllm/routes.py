"""vLLM's pooling API: POST /pooling (its task chosen from the model when none is sent)."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.responses import Response

from embedfleet.common.capabilities import ModelCapabilities
from embedfleet.common.errors import NoWorkerError, ValidationError
from embedfleet.producer.gateway.core import encoding
from embedfleet.producer.gateway.core.auth import admit, require_key
from embedfleet.producer.gateway.core.service import Gateway, gateway
from embedfleet.producer.gateway.vllm.schemas import PoolingBody

router = APIRouter(dependencies=[Depends(require_key)])


@router.post("/pooling", dependencies=[Depends(admit)])
async def create_pooling(body: PoolingBody, gw: Gateway = Depends(gateway)) -> Response:
    if body.task == "plugin":  # vLLM's IO-processor plugins: none can be installed here
        raise ValidationError("No IOProcessor plugin installed. Please refer to the documentation and install a "
                              "plugin. This gateway serves no plugins: send `task` embed, token_embed, classify "
                              "or token_classify, as the model allows", param="task")
    if body.task is None:
        try:
            body = body.model_copy(update={"task": default_task(await gw.capabilities(body.model))})
        except NoWorkerError:  # no live worker to say what the model does: submit decides (bulk work waits)
            pass
    if (body.outputs is not None or body.task == "sparse_embed") and body.encoding_format in ("bytes", "bytes_only"):
        raise ValidationError("`encoding_format` bytes frames one array per input; sparse and multi-output answers "
                              "are JSON: send float or base64", param="encoding_format")
    result = await gw.run(body)
    return encoding.pooling_response(result, body.encoding_format)


def default_task(caps: ModelCapabilities) -> str:
    """vLLM's /pooling task when none is sent: `embed` for an embedding model, per-token class scores
    (`token_classify`) for a cross-encoder or classifier."""
    return next((task for task in ("embed", "token_classify", "token_embed") if task in caps.tasks), "embed")
