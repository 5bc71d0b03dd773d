"""Request bodies of the task routes: vLLM's /score, /rerank, /classify, /tokenize, /detokenize and TEI's
/rerank, /tokenize and /decode shapes (same paths, told apart by their field names)."""

from __future__ import annotations

from typing import Any

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, StrictBool, field_validator, model_validator

from embedfleet.common.bounds import INT32_MAX, FailFastList, TokenId, bounded_int, token_id_problem
from embedfleet.common.params import LEGACY_ACTIVATION, GatewayTruncation
from embedfleet.producer.client.tasks import TOP_N_ALLOWED
from embedfleet.producer.gateway.core.chat import ChatFields
from embedfleet.producer.gateway.core.schemas import Input

Texts = str | FailFastList[str]
TopN = bounded_int("`top_n`", 0, INT32_MAX, TOP_N_ALLOWED)


WEIGHTS = ("a bge-m3 model only: [dense, sparse, colbert] weights of FlagEmbedding's compute_score (their weighted "
           "mean); omitted: the dense cosine")


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str | None = Field(None, description="served model name; omitted: the only served model")
    user: str | None = Field(None, description="accepted for OpenAI compatibility, not used")

    @classmethod
    def known_fields(cls) -> tuple[str, ...]:
        """What "did you mean" picks from for a misspelt field of this body (producer.gateway.core.errors)."""
        return tuple(cls.model_fields)

    def param_fields(self) -> dict:
        """The PoolingParams fields that were sent (the producer verifies them; `activation` is vLLM's
        deprecated name of `use_activation`, mapped by PoolingParams)."""
        return self.model_dump(include={"truncate_prompt_tokens", "use_activation", "add_special_tokens",
                                        "score_weights", *LEGACY_ACTIVATION}, exclude_none=True)


class _Activation(_Body):
    """The switch of the score and class activation, under its current name and vLLM's deprecated one."""

    use_activation: bool | None = None
    activation: bool | None = Field(None, description="vLLM's deprecated alias of use_activation")


class ScoreBody(_Activation):
    """vLLM's /score: `text_1` against `text_2`, one against many or pairwise."""

    # newer vLLM names the two sides `queries` / `documents` or `items` (`data_1` / `data_2` before): all are
    # accepted, one name per side
    text_1: Texts = Field(validation_alias=AliasChoices("text_1", "queries", "data_1"))
    text_2: Texts = Field(validation_alias=AliasChoices("text_2", "documents", "items", "data_2"))
    truncate_prompt_tokens: GatewayTruncation | None = None
    score_weights: FailFastList[float] | None = Field(None, description=WEIGHTS)

    @model_validator(mode="before")
    @classmethod
    def _one_name_per_side(cls, data):
        """Two names of one side would silently drop one of them: refused, naming both."""
        if isinstance(data, dict):
            for names in SIDES:
                sent = [name for name in names if name in data]
                if len(sent) > 1:
                    raise ValueError(f"{' and '.join(f'`{n}`' for n in sent)} name the same side of the pairs: "
                                     "send one of them")
        return data

    @classmethod
    def known_fields(cls) -> tuple[str, ...]:
        return tuple(name for name in cls.model_fields if name not in ("text_1", "text_2")) + SIDES[0] + SIDES[1]


SIDES = (("text_1", "queries", "data_1"), ("text_2", "documents", "items", "data_2"))


class RerankBody(_Activation):
    """vLLM's /rerank, Cohere's and Jina's /v1/rerank: documents best first for the query."""

    query: str
    documents: FailFastList[str]
    top_n: TopN | None = Field(None, description="keep the best n; 0 or omitted: all")
    return_documents: bool = True
    truncate_prompt_tokens: GatewayTruncation | None = None
    score_weights: FailFastList[float] | None = Field(None, description=WEIGHTS)


class TeiRerankBody(_Body):
    """TEI's /rerank: `texts` for documents, `raw_scores` for no activation, `return_text`."""

    query: str
    texts: FailFastList[str]
    raw_scores: StrictBool = False  # TEI's serde booleans: true or false only
    return_text: StrictBool = False
    truncate: StrictBool | None = None

    def param_fields(self) -> dict:
        # activation is the model's default: sent only to switch it off, so that a bi-encoder (whose score
        # takes no activation) still answers TEI's body
        return {**({"use_activation": False} if self.raw_scores else {}),
                **({"truncate_prompt_tokens": -1} if self.truncate else {})}


class ClassifyBody(ChatFields, _Activation):
    """vLLM's /classify; chat `messages` instead of `input` as vLLM's ClassificationChatRequest."""

    input: Input = None
    truncate_prompt_tokens: GatewayTruncation | None = None
    add_special_tokens: bool | None = None


class TokenizeBody(_Body):
    """vLLM's /tokenize."""

    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool = False


class TeiTokenizeBody(_Body):
    """TEI's /tokenize: `inputs`, one text or many; answers a list of tokens per text."""

    inputs: Texts
    add_special_tokens: StrictBool = True


class DetokenizeBody(_Body):
    """vLLM's /detokenize."""

    tokens: FailFastList[TokenId]


class TeiDecodeBody(_Body):
    """TEI's /decode: one id list or many; special tokens left out unless skip_special_tokens is false."""

    ids: FailFastList[int] | FailFastList[FailFastList[int]]
    skip_special_tokens: StrictBool = True

    @field_validator("ids")
    @classmethod
    def _bounded(cls, ids):
        """Bounded once the shape is known (a bounded type inside the union would report both shapes)."""
        if problem := token_id_problem([ids] if ids and isinstance(ids[0], int) else ids):
            raise ValueError(f"`ids`: {problem}")
        return ids

    def param_fields(self) -> dict:
        return {"add_special_tokens": not self.skip_special_tokens}


def pick(data: Any, tei_field: str, vllm: type[BaseModel], tei: type[BaseModel]) -> type[BaseModel]:
    """The body class of a shared path: TEI's when its own field name is there."""
    return tei if isinstance(data, dict) and tei_field in data else vllm
