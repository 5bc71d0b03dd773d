"""Preprocess: a verified request's inputs -> the token-id lists to embed (prompt, special tokens, truncation)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from common.errors import InputTooLongError, ValidationError
from common.request import EmbedRequest
from worker.engine.chat import render
from worker.engine.chunking import Specials, combine, find_specials, split
from worker.engine.latechunking import plan_spans
from worker.engine.models import plaintext
from worker.engine.models.base import LoadedModel


@dataclass
class Prepared:
    """One request's token-id lists, ready for batching."""

    token_lists: list[list[int]]
    prompt_length: int = 0  # tokens to leave out of pooling (only with ST's include_prompt=False)
    # what the forward pass returns: "pool" (one vector per row), "tokens" (one per token), or "outputs:<heads>" (a
    # multi-head or sparse model's parts, worker/engine/tasks/sparse.py)
    head: str = "pool"
    pair_starts: list[int] | None = None  # a cross-encoder's pairs: where each row's second text starts
    owners: list[int] | None = None  # chunked inputs: the input each token list is a chunk of (ascending)
    spans: list[tuple[int, int, int, int, int]] | None = None  # late chunking: one output row per span

    @property
    def prompt_tokens(self) -> int:
        """Tokens actually embedded: after truncation, special and prompt tokens included (every chunk's)."""
        return sum(len(ids) for ids in self.token_lists)

    @property
    def prompt_lengths(self) -> list[int]:
        """Per token list: the prompt sits at the front of an input, so in its first chunk only."""
        if self.owners is None:
            return [self.prompt_length] * len(self.token_lists)
        return [self.prompt_length if k == 0 or self.owners[k - 1] != owner else 0
                for k, owner in enumerate(self.owners)]

    def pooled(self, rows: np.ndarray) -> np.ndarray:
        """One row per input: a chunked input's chunk rows combined by their token-count-weighted mean."""
        if self.owners is None:
            return rows
        return combine(rows, self.owners, [len(ids) for ids in self.token_lists], self.owners[-1] + 1)


def _prompt_text(model: LoadedModel, request: EmbedRequest) -> str | None:
    params = request.params
    if params.prompt is not None:
        return params.prompt
    return model.caps.prompts.get(params.prompt_name) if params.prompt_name else None


def _tokenize(model: LoadedModel, texts: list[str], add_special_tokens: bool, keep: int | None,
              side: str) -> list[list[int]]:
    """One tokenizer call; with `keep`, the tokenizer's own truncation, which keeps the special tokens (as
    vLLM does). Should it refuse (`keep` below the special tokens alone), `prepare` slices instead."""
    tokenizer = model.tokenizer
    if keep is not None:
        saved = tokenizer.truncation_side
        try:
            tokenizer.truncation_side = side
            return tokenizer(texts, add_special_tokens=add_special_tokens, truncation=True,
                             max_length=keep)["input_ids"]
        except Exception:  # noqa: BLE001 - tokenizers raise various errors for an impossible max_length
            pass
        finally:
            tokenizer.truncation_side = saved
    return tokenizer(texts, add_special_tokens=add_special_tokens)["input_ids"]


def _as_messages(model, spec, inputs: list[str], prompt: str | None, keep: int | None,
                 side: str) -> list[list[int]]:
    """Each string rendered as a user message (the prompt as a system message) and tokenised as ST does; cut
    to `keep` with the template's tail restored (worker/engine/models/plaintext.py). The prompt is never
    left out of pooling here: ST does not track it for messages either."""
    rows = plaintext.render_ids(model.tokenizer, spec, inputs, prompt)
    if keep is None or not any(len(ids) > keep for ids in rows):
        return rows
    suffix = plaintext.suffix_ids(model.tokenizer, spec, prompt) if spec.restore_suffix else []
    return [plaintext.truncate(ids, keep, side, suffix) for ids in rows]


def _truncate_ids(ids: list[int], keep: int, side: str) -> list[int]:
    return list(ids[-keep:]) if side == "left" else list(ids[:keep])


def prepare(model: LoadedModel, request: EmbedRequest) -> Prepared:
    """Tokenise a request already resolved against the model's caps.

    Texts get the prompt prepended (ST's `prompt + text`) and special tokens per `add_special_tokens`;
    token-id inputs are embedded exactly as given (no prompt, no special tokens, like vLLM). With
    `truncate_prompt_tokens` None an input longer than the model's max length raises
    InputTooLongError; -1 truncates to the max length, k to k tokens, from `truncation_side`.
    """
    params, caps = request.params, model.caps
    keep = None if params.truncate_prompt_tokens is None else \
        (caps.max_model_len if params.truncate_prompt_tokens == -1 else params.truncate_prompt_tokens)
    side = params.truncation_side or caps.truncation_side
    prompt_length = 0
    late = params.chunk_size is not None or params.chunk_spans is not None
    prompt = texts = inputs = None
    if request.is_tokens:
        token_lists = [list(ids) for ids in request.inputs]
    else:
        prompt = _prompt_text(model, request)
        inputs = [render(model.tokenizer, request.chat)] if request.chat is not None else list(request.inputs)
        as_message = getattr(model, "plain_text", None) if request.chat is None else None
        if as_message is not None:  # sentence-transformers 6's plain text on a chat-template folder
            token_lists = _as_messages(model, as_message, inputs, prompt, keep, side)
            prompt = texts = inputs = None  # from here on the rendered rows are token ids (chunks, spans)
        else:
            texts = [prompt + text for text in inputs] if prompt else inputs
            token_lists = _tokenize(model, texts, params.add_special_tokens, keep, side)
        if prompt and not model.pooler.include_prompt:
            prompt_length = model.prompt_length(prompt, params.add_special_tokens)

    long = {}
    for index, ids in enumerate(token_lists):
        if not ids:
            raise ValidationError(f"input {index} has no tokens to embed: send a non-empty text or keep "
                                  "add_special_tokens on", param="input")
        if keep is None and len(ids) > caps.max_model_len and caps.max_embed_len and not late:
            if len(ids) > caps.max_embed_len:
                raise InputTooLongError(
                    f"input {index} has {len(ids)} tokens, more than the max_embed_len {caps.max_embed_len} of "
                    f"model '{caps.name}' (inputs above its max length {caps.max_model_len} are embedded in "
                    "chunks up to that many tokens): shorten it, or send truncate_prompt_tokens=-1 to "
                    "truncate to the max length. Please reduce the length of the input prompt.", param="input")
            long[index] = ids
        elif keep is None and len(ids) > caps.max_model_len:
            raise InputTooLongError(
                f"input {index} has {len(ids)} tokens, more than the maximum {caps.max_model_len} of "
                f"model '{caps.name}': shorten it, or send truncate_prompt_tokens=-1 to truncate to "
                "the maximum. Please reduce the length of the input prompt.", param="input")
        if keep is not None and len(ids) > keep:  # token-id inputs, or a tokenizer that would not cut
            token_lists[index] = _truncate_ids(ids, keep, side)
    if late:  # late chunking reads each input whole: it was checked against the max length above
        return Prepared([list(ids) for ids in token_lists], prompt_length,
                        spans=plan_spans(model, request, token_lists, None if texts is None else inputs, prompt))
    if long:
        return _chunked(model, request, texts, token_lists, long, prompt_length)
    return Prepared([list(ids) for ids in token_lists], prompt_length)


def _chunked(model: LoadedModel, request: EmbedRequest, texts: list[str] | None, token_lists: list[list[int]],
             long: dict[int, list[int]], prompt_length: int) -> Prepared:
    """Inputs longer than the model cut into chunks of its max length (worker/engine/chunking.py). A text's chunks
    each get the special tokens the tokenizer puts around one sequence; token-id inputs are cut as given."""
    max_len = model.caps.max_model_len
    chunks: dict[int, list[list[int]]] = {}
    if texts is not None and request.params.add_special_tokens:
        order = list(long)
        contents = model.tokenizer([texts[i] for i in order], add_special_tokens=False)["input_ids"]
        for index, content in zip(order, contents):
            specials = find_specials(long[index], list(content))
            # A tokenizer whose specials do not simply wrap the content: cut its own output as it is.
            chunks[index] = split(list(content), max_len, specials) if specials is not None \
                else split(long[index], max_len)
    else:
        chunks = {index: split(list(ids), max_len, Specials()) for index, ids in long.items()}
    rows: list[list[int]] = []
    owners: list[int] = []
    for index, ids in enumerate(token_lists):
        pieces = chunks.get(index) or [list(ids)]
        rows.extend(pieces)
        owners.extend([index] * len(pieces))
    return Prepared(rows, prompt_length, owners=owners)
