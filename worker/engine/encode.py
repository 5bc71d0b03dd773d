"""Token ids of many texts in one call, straight from a fast tokenizer's Rust backend when that is what the
transformers wrapper would run anyway.

transformers' fast-tokenizer call sets the backend's truncation, runs its `encode_batch`, then converts every
Encoding into Python dicts (ids, type ids, attention mask, ...): that conversion costs as much as the Rust
encoding itself, for fields the worker never reads. Here the backend is set up by the wrapper's own
`set_truncation_and_padding` (same settings, same checks) and only the ids are read. A tokenizer class that
changes how it encodes (its own `_encode_plus` or `__call__`), or a slow one, goes through the wrapper.
"""

from __future__ import annotations

import functools


def token_ids(tokenizer, texts: list[str], add_special_tokens: bool, max_length: int | None = None) -> list[list[int]]:
    """`tokenizer(texts, add_special_tokens=..., truncation=max_length is not None, max_length=...)["input_ids"]`,
    truncated from the tokenizer's `truncation_side`."""
    if not _plain_backend(type(tokenizer)):
        if max_length is None:
            return tokenizer(texts, add_special_tokens=add_special_tokens)["input_ids"]
        return tokenizer(texts, add_special_tokens=add_special_tokens, truncation=True,
                         max_length=max_length)["input_ids"]
    from transformers.tokenization_utils_base import TruncationStrategy  # noqa: PLC0415 - loaded with the model
    from transformers.utils import PaddingStrategy  # noqa: PLC0415

    truncation = TruncationStrategy.DO_NOT_TRUNCATE if max_length is None else TruncationStrategy.LONGEST_FIRST
    tokenizer.set_truncation_and_padding(padding_strategy=PaddingStrategy.DO_NOT_PAD, truncation_strategy=truncation,
                                         max_length=max_length, stride=0, pad_to_multiple_of=None, padding_side=None)
    backend = tokenizer.backend_tokenizer
    if backend.encode_special_tokens != tokenizer.split_special_tokens:
        backend.encode_special_tokens = tokenizer.split_special_tokens
    return [encoding.ids for encoding in backend.encode_batch(texts, add_special_tokens=add_special_tokens)]


@functools.cache
def _plain_backend(cls) -> bool:
    """A transformers fast tokenizer that encodes as its base class does."""
    try:
        from transformers.tokenization_utils_tokenizers import TokenizersBackend  # noqa: PLC0415
    except ImportError:  # another transformers layout: the wrapper, always
        return False
    return issubclass(cls, TokenizersBackend) and all(
        getattr(cls, name, None) is getattr(TokenizersBackend, name, None)
        for name in ("__call__", "_call_one", "encode_plus", "_encode_plus", "set_truncation_and_padding"))
