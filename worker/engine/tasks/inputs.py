"""Preprocess for the tasks beyond `embed`: a verified request -> the token-id lists to run (Prepared), or,
for tokenize and detokenize, which need no forward pass, its answer at once."""

from __future__ import annotations

import numpy as np

from embedfleet.common.errors import InputTooLongError
from embedfleet.common.request import EmbedRequest
from embedfleet.common.result import Result
from embedfleet.worker.engine.preprocess import prepare
from embedfleet.worker.engine.seam import Prepared
from embedfleet.worker.engine.tasks.sparse import prepare_outputs, wanted


def prepare_task(model, request: EmbedRequest) -> Prepared | Result:
    task = request.params.task
    if heads := wanted(model, request):  # a multi-head or sparse model's heads (worker/engine/tasks/sparse.py)
        return prepare_outputs(model, request, heads)
    if task == "tokenize":
        return tokenize(model, request)
    if task == "detokenize":
        return detokenize(model, request)
    if task == "score" and model.caps.pooling == "classifier":
        return _pairs(model, request)
    if task == "score":  # a bi-encoder: both sides embedded as rows of their own, first texts then seconds
        both = request.model_copy(update={"inputs": list(request.inputs) + list(request.text_pair),
                                          "text_pair": None})
        return _with_head(model, prepare(model, both), task)
    return _with_head(model, prepare(model, request), task)


def _with_head(model, prepared: Prepared, task: str) -> Prepared:
    """token_embed, token_classify, and score on a model that serves no pooled vectors (ColBERT): one row per
    token."""
    if task in ("token_embed", "token_classify") or (task == "score" and "embed" not in model.caps.tasks):
        prepared.head = "tokens"
    return prepared


def _pairs(model, request: EmbedRequest) -> Prepared:
    """A cross-encoder's (first, second) pairs, each one row as the tokenizer joins them (special tokens
    and segment ids); too long fails unless truncate_prompt_tokens, which cuts the longer side first."""
    params, caps = request.params, model.caps
    keep = None if params.truncate_prompt_tokens is None else \
        (caps.max_model_len if params.truncate_prompt_tokens == -1 else params.truncate_prompt_tokens)
    encoded = model.tokenizer(list(request.inputs), list(request.text_pair),
                              add_special_tokens=params.add_special_tokens,
                              truncation="longest_first" if keep else False, max_length=keep)
    token_lists = [list(ids) for ids in encoded["input_ids"]]
    for index, ids in enumerate(token_lists):
        if keep is None and len(ids) > caps.max_model_len:
            raise InputTooLongError(
                f"pair {index} has {len(ids)} tokens, more than the maximum {caps.max_model_len} of "
                f"model '{caps.name}': shorten it, or send truncate_prompt_tokens=-1 to truncate to "
                "the maximum. Please reduce the length of the input prompt.", param="input")
    types = encoded.get("token_type_ids")
    starts = [row.index(1) if 1 in row else 0 for row in types] if types is not None else None
    return Prepared(token_lists, pair_starts=starts)


def tokenize(model, request: EmbedRequest) -> Result:
    """One item per text: ids, token strings, character offsets (fast tokenizers) and which are special."""
    tokenizer, add = model.tokenizer, request.params.add_special_tokens
    fast = getattr(tokenizer, "is_fast", False)
    encoded = tokenizer(list(request.inputs), add_special_tokens=add, return_offsets_mapping=fast)
    special = set(tokenizer.all_special_ids)
    items = []
    for row, ids in enumerate(encoded["input_ids"]):
        offsets = [list(pair) for pair in encoded["offset_mapping"][row]] if fast else None
        items.append({"ids": list(ids), "tokens": tokenizer.convert_ids_to_tokens(list(ids)),
                      "offsets": offsets, "special": [i in special for i in ids]})
    total = sum(len(item["ids"]) for item in items)
    return _answer(model, request, "tokenize", items, total)


def detokenize(model, request: EmbedRequest) -> Result:
    """One text per token-id list; special tokens stay in the text unless add_special_tokens is off."""
    skip = not request.params.add_special_tokens
    items = [model.tokenizer.decode(list(ids), skip_special_tokens=skip) for ids in request.inputs]
    return _answer(model, request, "detokenize", items, sum(len(ids) for ids in request.inputs))


def _answer(model, request: EmbedRequest, task: str, items: list, tokens: int) -> Result:
    empty = np.zeros((len(items), 0), np.float32)
    return Result.success(request.id, model.caps.name, empty, "float32", request.params.endianness,
                          tokens).with_task(task, items=items)
