"""PoolingParams: vLLM's pooling knobs plus the output format, with defaults and verification."""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from embedfleet.common.bounds import FAIL_FAST, MAX_CHAR_OFFSET, MAX_DIMENSIONS, MAX_TOKENS, bounded_int, shown
from embedfleet.common.capabilities import ModelCapabilities
from embedfleet.common.codec import check_text
from embedfleet.common.errors import ValidationError
from embedfleet.common.frozen import updated

# fp8_e4m3 / fp8_e5m2: vLLM's 8-bit floats (torch float8_e4m3fn / float8_e5m2), stored as their bits.
EmbedDtype = Literal["float32", "float16", "bfloat16", "int8", "uint8", "binary", "ubinary", "fp8_e4m3",
                     "fp8_e5m2"]
Endianness = Literal["native", "little", "big"]
EMBED_DTYPES: tuple[str, ...] = EmbedDtype.__args__
# vLLM's pooling tasks (plus tokenize/detokenize, which need no forward pass): one request kind each.
# token_classify: a classifier's labels scored at every token (vLLM's default /pooling task of a cross-encoder);
# on bge-m3 its lexical weight per token, as vLLM serves it. sparse_embed: one sparse vector over the vocabulary per
# input (bge-m3's lexical weights, SPLADE), token ids + weights (common/result.py).
Task = Literal["embed", "score", "classify", "token_embed", "token_classify", "tokenize", "detokenize",
               "sparse_embed"]
TASKS: tuple[str, ...] = Task.__args__
# What one forward pass of a multi-head model (bge-m3) gives: the CLS vector, the lexical weights, the ColBERT
# vectors. A request names several with `outputs` and gets them all from one pass, in one result.
Output = Literal["dense", "sparse", "colbert"]
OUTPUTS: tuple[str, ...] = Output.__args__
SPARSE_TASKS = ("sparse_embed",)  # the tasks whose answer is sparse vectors
FLOAT_DTYPES = ("float32", "float16", "bfloat16")
PACKED_DTYPES = ("binary", "ubinary")  # one bit per dimension, eight dimensions per byte
MAX_CHUNK_SPANS = 4096  # late-chunking spans one request may ask for


def _truncation(value: int) -> int:
    if value != -1 and not 1 <= value <= MAX_TOKENS:
        raise ValueError("`truncate_prompt_tokens` must be -1 (the model's max length) or a positive integer "
                         f"of at most {MAX_TOKENS}, got {shown(value)}")
    return value


def _spans(value):
    if not value or len(value) > MAX_CHUNK_SPANS:
        raise ValueError(f"`chunk_spans` must hold 1 to {MAX_CHUNK_SPANS} [start, end] pairs, got {len(value)}")
    for k, (start, end) in enumerate(value):
        if not 0 <= start < end <= MAX_CHAR_OFFSET:
            raise ValueError(f"`chunk_spans`[{k}] = [{shown(start)}, {shown(end)}] must be character offsets with "
                             f"0 <= start < end <= {MAX_CHAR_OFFSET}")
    return value


def check_embed_dtype(value):
    """vLLM's words for an unknown dtype (its clients match on the start), naming the allowed ones; Python
    keywords and HTTP bodies meet this one check."""
    if value is not None and (not isinstance(value, str) or value not in EMBED_DTYPES):
        raise ValueError(f"embed_dtype={value!r} is not supported. Supported `embed_dtype` values: "
                         f"{list(EMBED_DTYPES)}")
    return value


# The integer fields, bounded (common/bounds.py); the gateway's request bodies use the same types.
Dimensions = bounded_int("`dimensions`", 1, MAX_DIMENSIONS, f"a positive integer of at most {MAX_DIMENSIONS}")
TruncatePromptTokens = Annotated[int, AfterValidator(_truncation),
                                 Field(json_schema_extra={"minimum": -1, "maximum": MAX_TOKENS})]
# The HTTP bodies of vLLM's routes also take 0, which vLLM answers with no inputs at all (its renderer keeps 0
# tokens and skips the prompts): the gateway answers that itself (producer/gateway/core/service.py); a request on
# the queue never carries it.
GatewayTruncation = Annotated[int, AfterValidator(lambda value: value if value == 0 else _truncation(value)),
                              Field(json_schema_extra={"minimum": -1, "maximum": MAX_TOKENS})]
ChunkSize = bounded_int("`chunk_size`", 1, MAX_TOKENS, f"a positive number of tokens, at most {MAX_TOKENS}")
ChunkSpans = Annotated[tuple[tuple[int, int], ...], FAIL_FAST, AfterValidator(_spans)]
SparseTopK = bounded_int("`sparse_top_k`", 1, MAX_DIMENSIONS, f"a positive integer of at most {MAX_DIMENSIONS}")


def _outputs(value):
    if not value or len(set(value)) != len(value):
        raise ValueError(f"`outputs` must name each of {list(OUTPUTS)} at most once, and at least one")
    return value


def _weights(value):
    if any(not math.isfinite(w) or w < 0 for w in value) or not sum(value) > 0:
        raise ValueError("`score_weights` must be 3 finite weights [dense, sparse, colbert], none negative, "
                         f"with a positive sum; got {list(value)}")
    return value


def _threshold(value):
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"`sparse_threshold` must be a finite number >= 0, got {value}")
    return value


Outputs = Annotated[tuple[Output, ...], FAIL_FAST, AfterValidator(_outputs)]
ScoreWeights = Annotated[tuple[float, float, float], AfterValidator(_weights)]
SparseThreshold = Annotated[float, AfterValidator(_threshold)]


class PoolingParams(BaseModel):
    """Per-request pooling and output options. `None` means "the served model's default"."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    task: Task = "embed"
    dimensions: Dimensions | None = None
    use_activation: bool | None = None
    truncate_prompt_tokens: TruncatePromptTokens | None = None
    truncation_side: Literal["left", "right"] | None = None
    prompt_name: str | None = None
    prompt: str | None = None
    add_special_tokens: bool = True
    embed_dtype: EmbedDtype = "float32"
    endianness: Endianness = "native"
    # Late chunking (worker/engine/latechunking.py): one vector per span of an input, pooled from the token states
    # of one forward pass over the whole input. `chunk_size`: spans of that many tokens; `chunk_spans`:
    # [start, end) character offsets into the request's one text input.
    chunk_size: ChunkSize | None = None
    chunk_spans: ChunkSpans | None = None
    # Several outputs of one forward pass (a bge-m3 model: common.capabilities.outputs), task embed only.
    outputs: Outputs | None = None
    # Sparse vectors (task sparse_embed, or "sparse" in outputs): keep an input's `sparse_top_k` largest weights
    # (sentence-transformers' max_active_dims) and only weights above `sparse_threshold` (default: above 0).
    sparse_top_k: SparseTopK | None = None
    sparse_threshold: SparseThreshold | None = None
    # Task score on a bge-m3 model: FlagEmbedding's compute_score weights [dense, sparse, colbert]; the score is
    # their weighted mean. None: the cosine of the dense vectors, as on any bi-encoder.
    score_weights: ScoreWeights | None = None

    @model_validator(mode="before")
    @classmethod
    def _legacy_normalize(cls, data):
        """vLLM's deprecated `normalize` (embeddings) and `activation` (scores, classes) are the same switch as
        `use_activation`: vLLM still accepts them with that meaning."""
        for legacy in LEGACY_ACTIVATION:
            if isinstance(data, dict) and legacy in data:
                data = dict(data)
                value = data.pop(legacy)
                if data.get("use_activation") is not None and value is not None and data["use_activation"] != value:
                    raise ValueError(f"`{legacy}` is deprecated and conflicts with `use_activation`; "
                                     "send only `use_activation`")
                if value is not None:
                    data["use_activation"] = value
        return data

    @field_validator("prompt_name", "prompt")
    @classmethod
    def _unicode(cls, value):
        return check_text(value)  # msgpack carries UTF-8 only

    @field_validator("embed_dtype", mode="before")
    @classmethod
    def _known_dtype(cls, value):
        return check_embed_dtype(value)

    def resolve(self, caps: ModelCapabilities) -> PoolingParams:
        """Fill unset fields from the model's defaults and check everything against what it can do.

        Raises ValidationError naming the parameter, the value and what is allowed.
        """
        if self.task == "score" and caps.pooling != "classifier" and self.use_activation is not None:
            # vLLM scores a bi-encoder with its embed task, whose parameters have no activation: a client that
            # sends one expects a cross-encoder's sigmoid and would silently get cosines.
            raise ValidationError(
                f"Task embed only supports ['dimensions', 'normalize'] parameters, does not support "
                f"['use_activation'] parameters: model '{caps.name}' scores by the cosine of two embeddings; "
                "`use_activation` (`activation`) applies to cross-encoders only, omit it", param="use_activation")
        full = self.dimensions is not None and self.dimensions == caps.embedding_size
        merged = updated(self, **{
            # the full size is what every model gives: OpenAI clients that always send it get a no-op
            "dimensions": None if full else self.dimensions,
            "use_activation": caps.normalize if self.use_activation is None else self.use_activation,
            "truncation_side": self.truncation_side or caps.truncation_side,
            "prompt_name": self.prompt_name if (self.prompt_name or self.prompt is not None)
            else caps.default_prompt_name,
            # the dense part alone is what `embed` gives any embedding model: a plain embed answer (and cache entry)
            "outputs": None if self.outputs == ("dense",) else self.outputs,
        })
        merged._verify(caps)
        return merged

    def _verify(self, caps: ModelCapabilities) -> None:
        if self.task not in caps.tasks:
            raise ValidationError(unsupported_task(self.task, caps), param="task")
        if self.task != "embed":
            self._verify_task(caps)
        self._verify_sparse(caps)
        if self.dimensions is not None:
            if not caps.is_matryoshka:
                raise ValidationError(
                    f"`dimensions` is not supported by model '{caps.name}': it is not a Matryoshka "
                    f"model, so only its full size ({caps.embedding_size}) is available; omit "
                    f"`dimensions` or send {caps.embedding_size}", param="dimensions")
            if not 1 <= self.dimensions <= caps.embedding_size:
                raise ValidationError(
                    f"`dimensions`={self.dimensions} is out of range for model '{caps.name}': "
                    f"allowed is 1 to {caps.embedding_size}", param="dimensions")
            if caps.matryoshka_dimensions and self.dimensions not in caps.matryoshka_dimensions:
                raise ValidationError(
                    f"`dimensions`={self.dimensions} is not a Matryoshka dimension of model '{caps.name}': "
                    f"allowed are {list(caps.matryoshka_dimensions)}", param="dimensions")
        if self.truncate_prompt_tokens is not None and self.truncate_prompt_tokens > caps.max_model_len:
            raise ValidationError(  # vLLM's wording first: its clients match on it
                f"truncate_prompt_tokens value ({self.truncate_prompt_tokens}) is greater than max_model_len "
                f"({caps.max_model_len}) of model '{caps.name}'. Please request a smaller truncation size. "
                f"Allowed is -1 or 1 to {caps.max_model_len}", param="truncate_prompt_tokens")
        if self.prompt_name is not None and self.prompt is not None:
            raise ValidationError("send either `prompt` or `prompt_name`, not both", param="prompt")
        if self.prompt_name is not None and self.prompt_name not in caps.prompts:
            known = sorted(caps.prompts) or "none (the model defines no prompts)"
            raise ValidationError(
                f"`prompt_name`='{self.prompt_name}' is unknown to model '{caps.name}': known are "
                f"{known}", param="prompt_name")
        if self.chunk_size is not None and self.chunk_spans is not None:
            raise ValidationError("send either `chunk_size` or `chunk_spans`, not both", param="chunk_size")
        if self.chunk_size is not None and self.chunk_size >= caps.max_model_len:
            raise ValidationError(
                f"`chunk_size`={self.chunk_size} is not shorter than the max length "
                f"{caps.max_model_len} of model '{caps.name}': late chunking pools spans of one input read "
                f"whole, so allowed is 1 to {caps.max_model_len - 1}", param="chunk_size")
        if self.embed_dtype in PACKED_DTYPES and self.output_size(caps) % 8:
            raise ValidationError(
                f"`embed_dtype`='{self.embed_dtype}' packs 8 dimensions per byte, but the output has "
                f"{self.output_size(caps)} dimensions: use a `dimensions` that is a multiple of 8 "
                "or another embed_dtype", param="embed_dtype")

    def _verify_task(self, caps: ModelCapabilities) -> None:
        """The options that mean something only for `embed` vectors are refused for the other tasks."""
        if self.dimensions is not None:
            raise ValidationError(f"`dimensions` applies to task 'embed' only, not '{self.task}'",
                                  param="dimensions")
        if self.task != "token_embed" and self.embed_dtype != "float32":
            raise ValidationError(f"`embed_dtype` applies to tasks 'embed' and 'token_embed' only; task "
                                  f"'{self.task}' answers float32", param="embed_dtype")

    def _verify_sparse(self, caps: ModelCapabilities) -> None:
        """The multi-output and sparse options, against what the model's heads give."""
        if self.outputs is not None:
            if self.task != "embed":
                raise ValidationError(f"`outputs` applies to task 'embed' only, not '{self.task}'", param="outputs")
            unknown = [o for o in self.outputs if o not in caps.outputs]
            if unknown:
                given = f"gives {list(caps.outputs)} from one pass" if caps.outputs else \
                    "has one output per task (outputs need a multi-head model such as bge-m3)"
                raise ValidationError(f"`outputs` {unknown} not available: model '{caps.name}' {given}",
                                      param="outputs")
            if self.chunk_size is not None or self.chunk_spans is not None:
                raise ValidationError("late chunking (`chunk_size`, `chunk_spans`) pools dense vectors only; "
                                      "leave it out when asking for `outputs`", param="outputs")
        sparse = self.task in SPARSE_TASKS or "sparse" in (self.outputs or ())
        for name in ("sparse_top_k", "sparse_threshold"):
            if getattr(self, name) is not None and not sparse:
                raise ValidationError(f"`{name}` applies to sparse vectors only: task 'sparse_embed', or "
                                      "'sparse' in `outputs`", param=name)
        if self.score_weights is not None and (self.task != "score" or set(OUTPUTS) - set(caps.outputs)):
            raise ValidationError(
                "`score_weights` [dense, sparse, colbert] applies to task 'score' on a model that gives all three "
                f"(bge-m3); model '{caps.name}' gives {list(caps.outputs) or 'one output per task'}",
                param="score_weights")

    def output_size(self, caps: ModelCapabilities) -> int:
        if self.task == "token_embed" and caps.token_size:
            return caps.token_size
        return self.dimensions or caps.embedding_size


LEGACY_ACTIVATION = ("normalize", "activation")  # vLLM's deprecated names of `use_activation`


def unsupported_task(task: str, caps: ModelCapabilities) -> str:
    """vLLM's words for a task the model does not serve (its clients match on the start), then ours."""
    return f"Unsupported task: {task!r}. Model '{caps.name}' supports {list(caps.tasks)}"


_WIRE_SEEN: dict[tuple, PoolingParams] = {}  # a request's params as they came off the wire -> validated
_WIRE_SEEN_MOST = 256


def from_wire(raw: dict) -> PoolingParams | None:
    """The PoolingParams a request's decoded `params` map validates to, remembered by the map's exact keys,
    value types and values: a worker's round decodes the same few maps again and again (validating one costs
    about as much as the rest of its request). None where the map holds lists (not remembered) or does not
    validate: the request's own validation then judges it, with its usual message."""
    try:
        key = (tuple(raw.items()), tuple(map(type, raw.values())))  # types too: True == 1 == 1.0
        found = _WIRE_SEEN.get(key)
    except TypeError:  # a list value (chunk_spans, outputs, score_weights): validated with its request
        return None
    if found is None:
        try:
            found = PoolingParams.model_validate(raw)
        except ValueError:
            return None
        if len(_WIRE_SEEN) < _WIRE_SEEN_MOST:
            _WIRE_SEEN[key] = found
    return found
