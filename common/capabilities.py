"""What a served model can do, as advertised by its workers and checked by producers and workers alike."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, model_validator

from embedfleet.common.codec import packb, unpackb
from embedfleet.common.errors import DecodeError

MAX_EMBED_LEN = 1 << 20  # the most tokens --max-embed-len may allow one input (its chunks are held at once)


class ModelCapabilities(BaseModel):
    """Facts about one loaded model that requests are verified against."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    name: str
    max_model_len: int
    embedding_size: int  # after any Dense projection
    vocab_size: int
    pooling: str = "mean"
    normalize: bool = True  # the default for `use_activation`
    is_matryoshka: bool = False
    matryoshka_dimensions: tuple[int, ...] | None = None
    prompts: dict[str, str] = {}
    default_prompt_name: str | None = None
    truncation_side: str = "right"
    max_inputs: int = 2048
    # The request kinds (common.params.Task) this model answers; an advert without it predates tasks.
    tasks: tuple[str, ...] = ("embed",)
    labels: tuple[str, ...] = ()  # a classifier's label names by index (its config's id2label)
    token_size: int | None = None  # width of a token_embed vector (the hidden size, or a ColBERT projection's)
    # What one forward pass gives (common.params.OUTPUTS), for models with several heads: bge-m3 ("dense",
    # "sparse", "colbert"), a SPLADE model ("sparse",); empty for the rest. Sparse vectors span `vocab_size`.
    outputs: tuple[str, ...] = ()
    # Inputs longer than max_model_len and at most this many tokens are embedded in chunks (worker/engine/chunking.py);
    # None: they are refused (or truncated per request).
    max_embed_len: int | None = None
    # Chat input (common/chat.py): whether the tokenizer has a chat template of its own, and whether the worker
    # renders a template sent with the request (--trust-request-chat-template, off by default as in vLLM).
    has_chat_template: bool = False
    trust_request_chat_template: bool = False

    @model_validator(mode="after")
    def _bounded_embed_len(self):
        if self.max_embed_len is not None and not self.max_model_len < self.max_embed_len <= MAX_EMBED_LEN:
            raise ValueError(f"max_embed_len must exceed the model's max length ({self.max_model_len}) and be at "
                             f"most {MAX_EMBED_LEN} tokens, got {self.max_embed_len}")
        return self

    def encode(self) -> bytes:
        return packb(self.model_dump(mode="json"))

    @classmethod
    def decode(cls, raw: bytes) -> ModelCapabilities:
        try:
            return cls.model_validate(unpackb(raw))
        except Exception as exc:
            raise DecodeError(f"invalid model capabilities: {exc}", raw) from exc
