"""vLLM's /pooling request body."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from embedfleet.producer.gateway.core.schemas import EmbedBody


class PoolingBody(EmbedBody):
    """vLLM's /pooling body: the same fields; `encoding_format` also takes bytes and bytes_only; `task`
    also token_embed (a 2-D array per input), classify (the label probabilities), token_classify (the
    label probabilities of every token; bge-m3's lexical weight of every token) and sparse_embed ({indices, values}
    per input; ours: bge-m3, SPLADE); omitted: the model's default (producer/gateway/vllm/routes.py). `plugin`
    is vLLM's IO-processor task, refused with vLLM's words (no plugins here)."""

    task: Literal["embed", "token_embed", "classify", "token_classify", "sparse_embed", "plugin"] | None = None
    activation: bool | None = Field(None, description="vLLM's deprecated alias of use_activation")
