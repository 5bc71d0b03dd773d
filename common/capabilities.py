"""What a served model can do, as advertised by its workers and checked by producers and workers alike."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from common.codec import packb, unpackb
from common.errors import DecodeError


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

    def encode(self) -> bytes:
        return packb(self.model_dump(mode="json"))

    @classmethod
    def decode(cls, raw: bytes) -> ModelCapabilities:
        try:
            return cls.model_validate(unpackb(raw))
        except Exception as exc:
            raise DecodeError(f"invalid model capabilities: {exc}", raw) from exc
