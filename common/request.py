"""EmbedRequest: the frozen wire model a producer enqueues, with its msgpack codec."""

from __future__ import annotations

import time
import uuid

from pydantic import BaseModel, ConfigDict, Field, field_validator

from common import keys
from common.capabilities import ModelCapabilities
from common.codec import check_text, packb, unpackb
from common.errors import DecodeError, ValidationError
from common.params import PoolingParams

WIRE_VERSION = 1


def new_request_id() -> str:
    return uuid.uuid4().hex


class EmbedRequest(BaseModel):
    """One request: several inputs (texts, or token-id lists) embedded with one set of params."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(default_factory=new_request_id)
    model: str
    inputs: list[str] | list[list[int]]
    params: PoolingParams = PoolingParams()
    created_at: float = Field(default_factory=time.time)
    reply_to: str | None = None  # an optional per-producer stream that also gets the id on completion
    cache: bool = True  # False: computed afresh, neither read from nor written to the fleet's vector cache

    @field_validator("model", "inputs", "reply_to")
    @classmethod
    def _unicode(cls, value):
        return check_text(value)  # msgpack carries UTF-8 only

    @field_validator("inputs")
    @classmethod
    def _not_empty(cls, inputs):
        if not inputs:
            raise ValueError("`input` must hold at least one text or token-id list")
        if isinstance(inputs[0], list) and any(not ids for ids in inputs):
            raise ValueError("a token-id input must hold at least one token id")
        return inputs

    @property
    def is_tokens(self) -> bool:
        return isinstance(self.inputs[0], list)

    def resolve(self, caps: ModelCapabilities) -> EmbedRequest:
        """Verify against the model and merge its defaults; raises ValidationError."""
        if len(self.inputs) > caps.max_inputs:
            raise ValidationError(
                f"{len(self.inputs)} inputs in one request; model '{caps.name}' allows at most "
                f"{caps.max_inputs}", param="input")
        if self.is_tokens:
            bad = [t for ids in self.inputs for t in ids if not 0 <= t < caps.vocab_size]
            if bad:
                raise ValidationError(
                    f"token id {bad[0]} is outside model '{caps.name}''s vocabulary: allowed is 0 to "
                    f"{caps.vocab_size - 1}", param="input")
        return self.model_copy(update={"params": self.params.resolve(caps)})

    def encode(self) -> bytes:
        # `cache` travels only when off, so that a worker of an earlier build (extra="forbid") still reads
        # every request that leaves it at its default.
        return packb({"v": WIRE_VERSION, **self.model_dump(mode="json", exclude_defaults=False,
                                                           exclude=None if not self.cache else {"cache"})})

    @classmethod
    def decode(cls, raw: bytes) -> EmbedRequest:
        """Parse and validate; any failure is one DecodeError that keeps the raw bytes."""
        try:
            data = unpackb(raw)
            if not isinstance(data, dict):
                raise ValueError(f"expected a map, got {type(data).__name__}")
            version = data.pop("v", None)
            if version != WIRE_VERSION:
                raise ValueError(f"unsupported wire version {version!r} (this build reads {WIRE_VERSION})")
            return cls.model_validate(data)
        except Exception as exc:
            raise DecodeError(f"malformed embed request: {exc}", raw) from exc


INPUT_SHAPES = "a text, a list of texts, a token-id list, or a list of token-id lists"


def normalize_inputs(inputs) -> list[str] | list[list[int]]:
    """Accept what OpenAI's `input` accepts: a text, a token-id list, or a list of either, never mixed.

    Python keywords and HTTP bodies both come through here, so a wrong shape gets one message; anything
    else raises ValidationError(param="input").
    """
    if isinstance(inputs, str):
        return [inputs]
    if isinstance(inputs, (list, tuple)) and inputs:
        if all(_is_token(t) for t in inputs):
            return [list(inputs)]
        if all(isinstance(t, str) for t in inputs):
            return list(inputs)
        if all(isinstance(t, (list, tuple)) and all(_is_token(i) for i in t) for t in inputs):
            if not all(inputs):
                raise ValidationError("`input`: a token-id input must hold at least one token id",
                                      param="input")
            return [list(t) for t in inputs]
    if isinstance(inputs, (list, tuple)) and not inputs:
        raise ValidationError("`input` must hold at least one text or token-id list", param="input")
    raise ValidationError(f"`input` must be {INPUT_SHAPES}; got {_shape(inputs)}", param="input")


def _is_token(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _shape(value) -> str:
    """What a wrong `input` is, in a few words: "a list mixing str and list"."""
    if not isinstance(value, (list, tuple)):
        return f"a {type(value).__name__}"
    kinds = sorted({type(v).__name__ for v in value})
    return f"a list of {kinds[0]}" if len(kinds) == 1 else f"a list mixing {' and '.join(kinds)}"


def job_reply_to(job) -> str | None:
    """The reply stream named in an rq job's request, or None (no args, unreadable job data, bytes that are
    no request, or a `reply_to` outside the reply-stream key space): for every path that answers for a job
    without running it. Job data is input: any shape may arrive here."""
    try:
        args = job.args
    except Exception:  # noqa: BLE001 - rq raises DeserializationError, or anything for a corrupt hash
        return None
    if not isinstance(args, (list, tuple)) or not args or not isinstance(args[0], bytes):
        return None
    try:
        reply_to = EmbedRequest.decode(args[0]).reply_to
    except DecodeError:
        return None
    return reply_to if keys.is_reply_stream_key(reply_to) else None
