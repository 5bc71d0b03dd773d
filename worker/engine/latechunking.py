"""Late chunking: one vector per span of an input, each pooled from the token states of ONE forward pass
over the whole input (so every span's tokens have seen the full context), with the model's own pooling
restricted to the span's tokens, then its Dense layers.

Spans come from `chunk_size` (runs of that many content tokens, special tokens left out) or `chunk_spans`
(character offsets into the text: the content tokens that overlap each span, via the fast tokenizer's
offsets). Each span is reported as (input, token start, token end, char start, char end), ends exclusive,
chars being what its tokens cover in the text as sent (-1 for token-id inputs, which have no text).
"""

from __future__ import annotations

import numpy as np

from embedfleet.common.errors import ValidationError
from embedfleet.common.request import EmbedRequest

Span = tuple[int, int, int, int, int]


def plan_spans(model, request: EmbedRequest, token_lists: list[list[int]], texts: list[str] | None,
               prompt: str | None) -> list[Span]:
    """The spans of every input of a late-chunking request (already tokenised into `token_lists`)."""
    params = request.params
    spans: list[Span] = []
    for index, ids in enumerate(token_lists):
        if texts is None:
            content, offsets = list(range(len(ids))), None
        else:
            content, offsets = _content_offsets(model, texts[index], ids, request, prompt or "")
        if not content:
            raise ValidationError(f"input {index} has no content tokens to cut into spans", param="input")
        if params.chunk_size is not None:
            runs = [content[i:i + params.chunk_size] for i in range(0, len(content), params.chunk_size)]
        else:
            runs = [_overlapping(content, offsets, start, end, k, len(texts[index]))
                    for k, (start, end) in enumerate(params.chunk_spans)]
        for run in runs:
            chars = (-1, -1) if offsets is None else (offsets[run[0]][0], offsets[run[-1]][1])
            spans.append((index, run[0], run[-1] + 1, *chars))
    return spans


def _content_offsets(model, text: str, ids: list[int], request: EmbedRequest, prompt: str):
    """Positions of the text's own tokens in `ids` (neither special nor the prompt's) and every token's
    (start, end) in `text`: the tokenizer run again with offsets, with the cut the request's own
    tokenisation made (so its ids must come out the same)."""
    params = request.params
    tokenizer = model.tokenizer
    saved = tokenizer.truncation_side
    try:
        tokenizer.truncation_side = params.truncation_side or model.caps.truncation_side
        out = tokenizer(prompt + text, add_special_tokens=params.add_special_tokens, truncation=True,
                        max_length=len(ids), return_offsets_mapping=True, return_special_tokens_mask=True)
    finally:
        tokenizer.truncation_side = saved
    if list(out["input_ids"]) != list(ids):
        raise ValidationError("late chunking could not map this input's tokens back to its characters (the "
                              "tokenizer gives other tokens with offsets); use `chunk_size`", param="chunk_spans")
    shift = len(prompt)
    content = [p for p, special in enumerate(out["special_tokens_mask"])
               if not special and out["offset_mapping"][p][1] > shift]
    offsets = [(max(start - shift, 0), max(end - shift, 0)) for start, end in out["offset_mapping"]]
    return content, offsets


def _overlapping(content: list[int], offsets, start: int, end: int, k: int, length: int) -> list[int]:
    if offsets is None:
        raise ValidationError("`chunk_spans` needs a text input", param="chunk_spans")
    if end > length:
        raise ValidationError(f"`chunk_spans`[{k}] = [{start}, {end}] reaches past the input's {length} "
                              "characters", param="chunk_spans")
    run = [p for p in content if offsets[p][1] > start and offsets[p][0] < end]
    if not run:
        raise ValidationError(f"`chunk_spans`[{k}] = [{start}, {end}] covers no token of the input (only "
                              "whitespace, or cut off by truncation)", param="chunk_spans")
    return run


def embed_spans(model, token_lists: list[list[int]], spans: list[Span]) -> np.ndarray:
    """One forward pass over `token_lists` (padded as LoadedModel.embed pads them), then each span pooled
    by the model's pooling over its own tokens only, then the Dense layers. Float32 (len(spans), d)."""
    import torch  # noqa: PLC0415 - only a real model's pass needs it: a null-model worker never loads torch

    with torch.inference_mode():
        longest = max(len(ids) for ids in token_lists)
        input_ids = torch.full((len(token_lists), longest), model.pad_token_id, dtype=torch.long)
        attention = torch.zeros((len(token_lists), longest), dtype=torch.long)
        starts = []
        for row, ids in enumerate(token_lists):
            first = longest - len(ids) if model.padding_side == "left" else 0
            input_ids[row, first:first + len(ids)] = torch.as_tensor(ids, dtype=torch.long)
            attention[row, first:first + len(ids)] = 1
            starts.append(first)
        inputs = {"input_ids": input_ids.to(model.device), "attention_mask": attention.to(model.device)}
        if model._position_ids and model.padding_side == "left":
            inputs["position_ids"] = (inputs["attention_mask"].cumsum(-1) - 1).clamp(min=0)
        hidden = model.hidden_states(inputs)
        rows = torch.as_tensor([span[0] for span in spans], device=hidden.device)
        mask = torch.zeros((len(spans), longest), dtype=torch.long)
        for k, (row, start, end, _, _) in enumerate(spans):
            mask[k, starts[row] + start:starts[row] + end] = 1
        mask = mask.to(hidden.device)
        # The span is the whole sequence as far as pooling knows: CLS / last token / position weights count
        # from the span's own first token.
        return model.dense(model.pooler.pool(hidden[rows], mask, mask)).float().cpu().numpy()
