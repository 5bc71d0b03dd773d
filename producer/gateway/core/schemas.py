"""The request body every family builds on: OpenAI's /v1/embeddings body with vLLM's pooling fields, mapped onto
PoolingParams (/pooling's and /v1/jobs' bodies extend it: vllm/schemas.py, jobs/schemas.py)."""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, ConfigDict, Field, WithJsonSchema, field_validator, model_validator

from embedfleet.common.bounds import FailFastList
from embedfleet.common.codec import unencodable
from embedfleet.common.errors import ValidationError
from embedfleet.common.params import (LEGACY_ACTIVATION, ChunkSize, ChunkSpans, Dimensions, EmbedDtype, Endianness,
                                      GatewayTruncation, Output, PoolingParams, SparseTopK, check_embed_dtype)
from embedfleet.common.request import INPUT_SHAPES
from embedfleet.common.scheduling import priority_level, resolve_deadline
from embedfleet.producer.gateway.core.chat import ChatFields

EncodingFormat = Literal["float", "base64", "bytes", "bytes_only"]
# OpenAI's four shapes of `input`, documented in the schema but checked by common.request.normalize_inputs,
# the check Producer.submit runs too: one message for a wrong shape, whichever way it came in.
Input = Annotated[Any, WithJsonSchema({"anyOf": [
    {"type": "string"}, {"type": "array", "items": {"type": "string"}},
    {"type": "array", "items": {"type": "integer"}},
    {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}}]})]


def scheduling(check):
    """common.scheduling's check of a field (which raises ValidationError) as a pydantic validator, so that the
    body is refused with the message Producer.submit gives for the same value."""

    def validate(value):
        if value is not None:
            try:
                check(value)
            except ValidationError as err:
                raise ValueError(err.message) from None
        return value

    return AfterValidator(validate)


Priority = Annotated[int | str, scheduling(priority_level)]
Deadline = Annotated[float, scheduling(lambda at: resolve_deadline(at, None, time.time()))]
Timeout = Annotated[float, scheduling(lambda seconds: resolve_deadline(None, seconds, time.time()))]


class EmbedBody(ChatFields):
    """OpenAI's embeddings body plus vLLM's pooling extensions (every PoolingParams field), and vLLM's chat
    `messages` instead of `input` (producer/gateway/core/chat.py)."""

    # Unknown fields are refused, as OpenAI does, so that a misspelt option is not silently ignored.
    model_config = ConfigDict(extra="forbid", frozen=True)

    input: Input = Field(None, description=f"{INPUT_SHAPES}; or send `messages`")
    model: str | None = Field(None, description="served model name; omitted: the only served model")
    encoding_format: EncodingFormat = "float"
    user: str | None = Field(None, description="accepted for OpenAI compatibility, not used")
    # PoolingParams, None meaning "the model's default"; the producer verifies the values (param_fields).
    task: Literal["embed"] | None = None
    dimensions: Dimensions | None = None
    use_activation: bool | None = None
    normalize: bool | None = Field(None, description="vLLM's deprecated alias of use_activation")
    truncate_prompt_tokens: GatewayTruncation | None = None
    truncation_side: Literal["left", "right"] | None = None
    prompt_name: str | None = None
    prompt: str | None = None
    add_special_tokens: bool | None = None
    embed_dtype: EmbedDtype | None = None
    endianness: Endianness | None = None
    chunk_size: ChunkSize | None = Field(None, description="late chunking: one vector per this many tokens of "
                                                           "each input")
    chunk_spans: ChunkSpans | None = Field(
        None, description="late chunking: one vector per [start, end) character span of the one text input")
    outputs: FailFastList[Output] | None = Field(
        None, description="/pooling on a multi-head model (bge-m3): several of dense, sparse and colbert from one "
                          "forward pass, each input's answer an object with one key per output")
    sparse_top_k: SparseTopK | None = Field(None, description="sparse vectors: keep each input's k largest weights")
    sparse_threshold: float | None = Field(None, description="sparse vectors: keep the weights above this only")
    score_weights: FailFastList[float] | None = Field(None, description="task score only (/score, /rerank)")

    # Scheduling (common/scheduling.py): the level it is queued at, and when it stops being worth computing.
    priority: Priority | None = Field(None, description="`interactive` (default), `bulk`, or vLLM's integer "
                                                        "(<= 0 interactive, >= 1 bulk; lower is served sooner)")
    deadline: Deadline | None = Field(None, description="unix time after which a still-queued request is not "
                                                        "computed and fails with code `expired`")
    timeout: Timeout | None = Field(None, description="the same as `deadline`, in seconds from submit")

    cache: bool | None = Field(None, description="false: compute afresh, bypassing the fleet's vector cache")

    def schedule_fields(self) -> dict:
        """priority / deadline / timeout as sent, as keywords for Producer.submit (which validates them)."""
        return self.model_dump(include={"priority", "deadline", "timeout"}, exclude_none=True)

    def param_fields(self) -> dict:
        """The PoolingParams fields that were sent, as keywords for Producer.submit (which validates them)."""
        return self.model_dump(include=PARAM_FIELDS, exclude_none=True)

    def request_fields(self) -> dict:
        """param_fields plus the request's own options (`cache`) and scheduling, as keywords for
        Producer.submit."""
        return {**self.param_fields(), **({} if self.cache is None else {"cache": self.cache}),
                **self.schedule_fields()}

    @model_validator(mode="before")
    @classmethod
    def _unicode(cls, data):
        """JSON's "\\ud800" decodes to a lone surrogate, which no request can carry: refused, naming the field."""
        if isinstance(data, dict):
            for name, value in data.items():
                if unencodable(name):
                    raise ValueError(f"a field name is not valid Unicode text: {unencodable(name)}")
                found = unencodable(value)
                if found:
                    raise ValueError(f"`{name}` must be valid Unicode text, found {found}")
        return data

    @field_validator("embed_dtype", mode="before")
    @classmethod
    def _known_dtype(cls, value):
        return check_embed_dtype(value)  # the message PoolingParams gives Producer.submit too

    def dense_only(self, route: str) -> None:
        """OpenAI's answer (/v1/embeddings, /v1/jobs) has room for dense vectors only: other outputs are
        refused, pointing at /pooling, instead of being computed and dropped."""
        if self.outputs is not None and self.outputs != ["dense"]:
            raise ValidationError(f"{route} answers dense vectors only: send `outputs` with sparse or colbert to "
                                  "/pooling (or omit it)", param="outputs")

    @property
    def explicit_layout(self) -> bool:
        """True when the client chose the bytes' dtype or order itself (vLLM semantics for base64)."""
        return self.embed_dtype is not None or self.endianness is not None


PARAM_FIELDS = frozenset(PoolingParams.model_fields) | set(LEGACY_ACTIVATION)
