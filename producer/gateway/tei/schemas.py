"""Request bodies of text-embeddings-inference's /embed, /embed_all and /similarity (router/src/http/types.rs),
and TEI's `inputs` turned into the fleet's inputs with TEI's own messages."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, WithJsonSchema

from embedfleet.common.bounds import FailFastList
from embedfleet.common.errors import ValidationError
from embedfleet.common.params import Dimensions, SparseTopK

# TEI's booleans are serde's: true or false only ("yes", 1 or "true" are refused), hence StrictBool below.
# TEI's serde enum takes both spellings (`#[serde(alias = "left", alias = "Left")]`); huggingface_hub sends
# the lowercase one.
TruncationDirection = Literal["Left", "Right", "left", "right"]
# TEI's `Input`: one text or one token-id list, or a list of them.
TeiInput = Annotated[Any, WithJsonSchema({"anyOf": [
    {"type": "string"}, {"type": "array", "items": {"type": "integer"}},
    {"type": "array", "items": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "integer"}}]}}]})]
INPUTS_SHAPES = "a text, a token-id list, or a list of texts or of token-id lists"


class EmptyInputError(ValidationError):
    """TEI's `Empty` error type (an empty batch, an empty text): `error_type` "Empty" in TEI's body."""


class _TeiBody(BaseModel):
    # TEI ignores unknown fields; here a misspelt option (`normalise`) is refused with a "did you mean", as on
    # every other route of the gateway, rather than silently doing the default.
    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str | None = Field(None, description="embedfleet's addition: the served model to use; omitted: the "
                                                "only served model (TEI serves one model per server)")

    @classmethod
    def known_fields(cls) -> tuple[str, ...]:
        """What "did you mean" picks from for a misspelt field of this body (producer.gateway.core.errors)."""
        return tuple(cls.model_fields)


class _Truncation(BaseModel):
    truncate: StrictBool | None = Field(None, description="true: cut inputs longer than the model's max length; "
                                                    "false or omitted: such an input is an error")
    truncation_direction: TruncationDirection = Field("Right", description="which end `truncate` cuts")
    prompt_name: str | None = Field(None, description="a key of the model's sentence-transformers `prompts`")

    def truncation_fields(self) -> dict:
        """TEI's truncation and prompt options as PoolingParams fields."""
        fields = {"truncation_side": self.truncation_direction.lower()}
        if self.truncate:
            fields["truncate_prompt_tokens"] = -1  # the model's max length, as TEI truncates
        if self.prompt_name is not None:
            fields["prompt_name"] = self.prompt_name
        return fields


class TeiEmbedBody(_TeiBody, _Truncation):
    """TEI's POST /embed."""

    inputs: TeiInput
    normalize: StrictBool = Field(True, description="scale each vector to unit length (after `dimensions`)")
    dimensions: Dimensions | None = Field(None, description="keep the first n dimensions (any model, as TEI)")
    # huggingface_hub's feature_extraction sends it when asked (it is meant for OpenAI-style servers); TEI
    # ignores it and answers floats, which the client reads either way.
    encoding_format: Literal["float", "base64"] | None = Field(None, description="accepted and ignored, as TEI "
                                                                                 "does: the answer is floats")


class TeiEmbedAllBody(_TeiBody, _Truncation):
    """TEI's POST /embed_all: every token's vector, not pooled."""

    inputs: TeiInput


class TeiEmbedSparseBody(_TeiBody, _Truncation):
    """TEI's POST /embed_sparse: one sparse vector per input (a SPLADE model's, bge-m3's lexical weights), plus
    the fleet's `sparse_top_k` and `sparse_threshold` (common/params.py) to keep fewer values."""

    inputs: TeiInput
    sparse_top_k: SparseTopK | None = None
    sparse_threshold: float | None = None


class SimilarityInput(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    source_sentence: str
    sentences: FailFastList[str]


class SimilarityParameters(_Truncation):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TeiSimilarityBody(_TeiBody):
    """TEI's POST /similarity (the Inference API's sentence-similarity task)."""

    inputs: SimilarityInput
    parameters: SimilarityParameters | None = None


def tei_inputs(inputs) -> list[str] | list[list[int]]:
    """TEI's `inputs` as the fleet's list of texts or of token-id lists, with TEI's messages for empty ones."""
    if isinstance(inputs, str):
        batch = [inputs]
    elif isinstance(inputs, list) and inputs and all(_is_id(t) for t in inputs):
        batch = [inputs]  # one token-id list, as TEI reads a flat list of integers
    elif isinstance(inputs, list):
        batch = inputs
    else:
        raise ValidationError(f"`inputs` must be {INPUTS_SHAPES}; got a {type(inputs).__name__}", param="inputs")
    if not batch:
        raise EmptyInputError("`inputs` cannot be empty", param="inputs")
    texts = [isinstance(item, str) for item in batch]
    ids = [isinstance(item, list) and all(_is_id(t) for t in item) for item in batch]
    bad = next((i for i, (text, id_list) in enumerate(zip(texts, ids)) if not (text or id_list)), None)
    if bad is not None:
        raise ValidationError(f"`inputs`[{bad}] must be a text or a token-id list; `inputs` must be "
                              f"{INPUTS_SHAPES}", param="inputs")
    if any(texts) and not all(texts):
        raise ValidationError("`inputs` mixes texts and token-id lists: send texts and token ids in separate "
                              "requests", param="inputs")
    if any(len(item) == 0 for item in batch):
        raise EmptyInputError("`inputs` cannot be empty", param="inputs")  # TEI's word for an empty text too
    return batch


def _is_id(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
