"""EmbedRequest: the frozen wire model a producer enqueues, with its msgpack codec."""

from __future__ import annotations

import math
import time
import uuid

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from embedfleet.common.bounds import (CHARS_PER_TOKEN, INT32_MAX, MAX_REQUEST_BYTES, MAX_UNIX_TIME, long_text_problem,
                                      most_chars, text_limit, token_id_problem)
from embedfleet.common.capabilities import ModelCapabilities
from embedfleet.common.chat import CHAT_INPUT, CHAT_TASKS, NO_TEMPLATE, UNTRUSTED_TEMPLATE, ChatInput
from embedfleet.common.codec import check_text, packb, unpackb
from embedfleet.common.errors import DecodeError, InputTooLongError, ValidationError
from embedfleet.common.frozen import updated
from embedfleet.common.names import valid_request_id
from embedfleet.common.params import PoolingParams, from_wire
from embedfleet.common.tracing import traceparent_problem, tracestate_problem

WIRE_VERSION = 1
_DECODED = {"decoded": "msgpack"}  # validation context of a request read off the wire (EmbedRequest.decode)


def new_request_id() -> str:
    return uuid.uuid4().hex


class PartOf(BaseModel):
    """Marks a sub-job of a long request spread over the fleet (worker/serving/spread.py): chunk group `index` of
    `parts`; its answer goes to the request's join, never to a waiter of its own."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    parent: str
    index: int = Field(ge=0, le=INT32_MAX)
    parts: int = Field(ge=1, le=INT32_MAX)

    @field_validator("parent")
    @classmethod
    def _an_id(cls, value):
        if not valid_request_id(value):
            raise ValueError(f"`parent` must be a request id, got {value!r}")
        return value


class EmbedRequest(BaseModel):
    """One request: several inputs (texts, or token-id lists) embedded with one set of params."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(default_factory=new_request_id)
    model: str
    inputs: list[str] | list[list[int]]
    params: PoolingParams = PoolingParams()
    created_at: float = Field(default_factory=time.time)
    reply_to: str | None = None  # an optional per-producer stream that also gets the id on completion
    text_pair: list[str] | None = None  # task "score": the second text of each pair, aligned with `inputs`
    part_of: PartOf | None = None  # set by a worker on the parts of a spread long request only
    deadline: float | None = None  # unix time past which a still-queued request is answered `expired`
    cache: bool = True  # False: computed afresh, neither read from nor written to the fleet's vector cache
    chat: ChatInput | None = None  # a conversation the worker renders with the chat template (common/chat.py)
    # the caller's span (W3C Trace Context, common/tracing): the worker's spans for this request are its children
    traceparent: str | None = None
    tracestate: str | None = None  # the caller's vendor trace state, carried with its traceparent only

    @field_validator("deadline")
    @classmethod
    def _finite(cls, value):
        if value is not None and not (math.isfinite(value) and 0 < value <= MAX_UNIX_TIME):
            raise ValueError(f"`deadline` must be a unix time in seconds, at most {MAX_UNIX_TIME:.0f} (the year "
                             f"9999), got {value}")
        return value

    @field_validator("traceparent")
    @classmethod
    def _w3c_parent(cls, value):
        if value is not None and (problem := traceparent_problem(value)):
            raise ValueError(problem)
        return value

    @field_validator("tracestate")
    @classmethod
    def _w3c_state(cls, value):
        if value is not None and (problem := tracestate_problem(value)):
            raise ValueError(problem)
        return value

    @field_validator("model", "inputs", "reply_to", "text_pair")
    @classmethod
    def _unicode(cls, value, info: ValidationInfo):
        if info.context is _DECODED:  # msgpack decoded it as strict UTF-8, which has no lone surrogate
            return value
        return check_text(value)  # msgpack carries UTF-8 only

    @field_validator("inputs")
    @classmethod
    def _not_empty(cls, inputs):
        if not inputs:
            raise ValueError("`input` must hold at least one text or token-id list")
        if isinstance(inputs[0], list) and any(not ids for ids in inputs):
            raise ValueError("a token-id input must hold at least one token id")
        if isinstance(inputs[0], list) and (problem := token_id_problem(inputs)):
            raise ValueError(problem)
        empty = next((i for i, text in enumerate(inputs) if text == ""), None)
        if empty is not None:  # as OpenAI and TEI refuse it: it would embed only the special tokens
            raise ValueError(f"input {empty} is an empty string; every text input needs at least one character")
        return inputs

    @model_validator(mode="after")
    def _chat_placeholder(self):
        if self.chat is not None and list(self.inputs) != [CHAT_INPUT]:
            raise ValueError("a request with `chat` embeds one conversation: its `inputs` must be [CHAT_INPUT]")
        if self.tracestate is not None and self.traceparent is None:
            raise ValueError("`tracestate` travels with a `traceparent` only (W3C Trace Context)")
        return self

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
                    f"token id {bad[0]} is outside the vocabulary of model '{caps.name}': allowed is 0 to "
                    f"{caps.vocab_size - 1}", param="input")
        if self.params.chunk_spans is not None and (self.is_tokens or len(self.inputs) != 1):
            raise ValidationError("`chunk_spans` are character offsets into one text: send exactly one text "
                                  f"input with them (got {len(self.inputs)} "
                                  f"{'token-id list' if self.is_tokens else 'text'}(s)), or use `chunk_size`",
                                  param="chunk_spans")
        if self.is_tokens and caps.max_embed_len and self.params.truncate_prompt_tokens is None:
            longest = max(range(len(self.inputs)), key=lambda i: len(self.inputs[i]))
            if len(self.inputs[longest]) > caps.max_embed_len:
                raise InputTooLongError(
                    f"input {longest} has {len(self.inputs[longest])} tokens, more than the max_embed_len "
                    f"{caps.max_embed_len} of model '{caps.name}': shorten it, or send truncate_prompt_tokens=-1 "
                    "to truncate to the max length. Please reduce the length of the input prompt.", param="input")
        params = self.params.resolve(caps)
        self._check_text_lengths(caps, params)
        check_task_inputs(self, params.task)
        if self.chat is not None:
            self._check_chat(caps)
            params = updated(params, prompt_name=None)  # a conversation gets no default prompt
        return self.with_params(params)

    def with_params(self, params: PoolingParams) -> EmbedRequest:
        """`self.model_copy(update={"params": params})` (`params` already a PoolingParams), without its generic
        copying (common/frozen.py): a worker calls it for each request of a round, a producer for each it
        verifies."""
        return updated(self, params=params)

    def _check_text_lengths(self, caps: ModelCapabilities, params) -> None:
        """A text too long in characters alone to fit (common/bounds.py) fails before the worker reads it; the
        worker judges the rest by tokens (worker/engine/inputbounds.py)."""
        if self.is_tokens or self.chat is not None or params.truncate_prompt_tokens is not None \
                or params.task == "detokenize":
            return
        limit = text_limit(caps, params)
        for texts in (self.inputs, self.text_pair):
            if problem := long_text_problem(texts, limit):
                index, chars = problem
                hint = " (/tokenize too): shorten it" if params.task == "tokenize" else \
                    ": shorten it, or send truncate_prompt_tokens=-1 to truncate to the maximum"
                raise InputTooLongError(
                    f"input {index} has {chars:,} characters: model '{caps.name}' reads at most {limit} tokens of one "
                    f"input, and a text of more than {most_chars(limit):,} characters ({CHARS_PER_TOKEN} per token) "
                    f"holds more, or words too long to read{hint}. Please reduce the length of the input prompt.",
                    param="input")

    def _check_chat(self, caps: ModelCapabilities) -> None:
        """A conversation against what the model's worker can render (vLLM's messages for each refusal)."""
        if self.params.task not in CHAT_TASKS:
            raise ValidationError(f"task '{self.params.task}' takes `input` texts, not `messages`; `messages` are "
                                  f"for tasks {list(CHAT_TASKS)}", param="messages")
        if self.params.prompt is not None or self.params.prompt_name is not None:
            raise ValidationError("`prompt` and `prompt_name` apply to `input` texts, not to `messages`: put the "
                                  "instruction in a message, or leave them out", param="prompt_name")
        if self.params.chunk_spans is not None:
            raise ValidationError("`chunk_spans` are offsets into an `input` text, not into rendered `messages`: use "
                                  "`chunk_size`", param="chunk_spans")
        if self.chat.chat_template is None and not caps.has_chat_template:
            raise ValidationError(f"{NO_TEMPLATE} Model '{caps.name}' has none: send `chat_template`, or `input` "
                                  "texts", param="messages")
        if self.chat.chat_template is not None and not caps.trust_request_chat_template:
            raise ValidationError(f"{UNTRUSTED_TEMPLATE} The workers of model '{caps.name}' render only its "
                                  "own template: leave out `chat_template`", param="chat_template")

    def encode(self) -> bytes:
        """The request's wire bytes; ValidationError if it cannot be packed or is larger than a request may be
        (common/bounds.py), so that it fails alone, before it is enqueued with others."""
        data = self.model_dump(mode="json", exclude_defaults=False)
        # absent, not null: older workers refuse them
        for optional in ("text_pair", "part_of", "deadline", "chat", "traceparent", "tracestate"):
            if data[optional] is None:
                del data[optional]
        # a param left at None travels as no key (None is the default of every param that may be None, so the
        # worker reads the same params): a one-text request's 16 params were 243 of its 388 bytes, unpacked and
        # looked up by every worker (issue 38)
        data["params"] = {name: value for name, value in data["params"].items() if value is not None}
        try:
            raw = packb({"v": WIRE_VERSION, **data})
        except (OverflowError, ValueError, TypeError) as exc:  # a value no bound caught (a model_construct'ed one)
            raise ValidationError(f"the request cannot be encoded: {type(exc).__name__}: {exc}") from exc
        if len(raw) > MAX_REQUEST_BYTES:
            raise ValidationError(f"the request is {len(raw)} bytes encoded; a request may be at most "
                                  f"{MAX_REQUEST_BYTES} bytes: split its inputs over several requests", param="input")
        return raw

    def expired(self, now: float) -> bool:
        return self.deadline is not None and now >= self.deadline

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
            if type(data.get("params")) is dict and (params := from_wire(data["params"])) is not None:
                data["params"] = params  # validated already (an instance is taken as it is)
            return cls.model_validate(data, context=_DECODED)
        except Exception as exc:
            raise DecodeError(f"malformed embed request: {exc}", raw) from exc


def check_task_inputs(request: EmbedRequest, task: str) -> None:
    """The input shapes each task takes: pairs of texts for score, token ids for detokenize, texts for
    tokenize; ValidationError(param="input") naming what the task needs."""
    if task == "score":
        if request.text_pair is None or request.is_tokens:
            raise ValidationError("task 'score' takes pairs of texts: `inputs` (the first texts) and "
                                  "`text_pair` (the second texts), one of each per pair", param="input")
        if len(request.text_pair) != len(request.inputs):
            raise ValidationError(f"task 'score': {len(request.inputs)} first texts but "
                                  f"{len(request.text_pair)} second texts; send one of each per pair",
                                  param="input")
    elif request.text_pair is not None:
        raise ValidationError(f"`text_pair` is for task 'score' only, not '{task}'", param="input")
    if task == "detokenize" and not request.is_tokens:
        raise ValidationError("task 'detokenize' takes token-id lists, not texts", param="input")
    if task == "tokenize" and request.is_tokens:
        raise ValidationError("task 'tokenize' takes texts, not token-id lists", param="input")


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
            if problem := token_id_problem([inputs]):
                raise ValidationError(f"`input`: {problem}", param="input")
            return [list(inputs)]
        if all(isinstance(t, str) for t in inputs):
            return list(inputs)
        if all(isinstance(t, (list, tuple)) and all(_is_token(i) for i in t) for t in inputs):
            if not all(inputs):
                raise ValidationError("`input`: a token-id input must hold at least one token id",
                                      param="input")
            if problem := token_id_problem(inputs):
                raise ValidationError(f"`input`: {problem}", param="input")
            return [list(t) for t in inputs]
    if isinstance(inputs, (list, tuple)) and not inputs:
        raise ValidationError("`input` must hold at least one text or token-id list", param="input")
    raise ValidationError(f"`input` must be {INPUT_SHAPES}; got {_shape(inputs)}", param="input")


def _is_token(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _shape(value) -> str:
    """What a wrong `input` is, in a few words, and where it first goes wrong: "a list mixing list and str (input 1
    is a list, where input 0 is a text)"."""
    if not isinstance(value, (list, tuple)):
        return f"a {type(value).__name__}"
    kinds = sorted({type(v).__name__ for v in value})
    shape = f"a list of {kinds[0]}" if len(kinds) == 1 else f"a list mixing {' and '.join(kinds)}"
    where = _first_misfit(value)
    return f"{shape} ({where})" if where else shape


def _first_misfit(value) -> str | None:
    """The first item of a non-empty list that breaks the shape its first item starts (a list of a million items
    may be wrong from its second one: named, rather than left for the client to search)."""
    first = value[0]
    if isinstance(first, str):
        at = next((i for i, item in enumerate(value) if not isinstance(item, str)), None)
        return None if at is None else f"input {at} is a {type(value[at]).__name__}, where input 0 is a text"
    if _is_token(first):
        at = next((i for i, item in enumerate(value) if not _is_token(item)), None)
        return None if at is None else f"position {at} is a {type(value[at]).__name__}, not a token id"
    if not isinstance(first, (list, tuple)):
        return f"input 0 is a {type(first).__name__}"
    for i, item in enumerate(value):
        if not isinstance(item, (list, tuple)):
            return f"input {i} is a {type(item).__name__}, where input 0 is a token-id list"
        at = next((j for j, token in enumerate(item) if not _is_token(token)), None)
        if at is not None:
            return f"input {i}, position {at} is a {type(item[at]).__name__}, not a token id"
    return None
