"""Preprocess: a verified request's inputs -> the token-id lists to embed (prompt, special tokens, truncation),
as a Prepared (worker/engine/seam.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from embedfleet.common.errors import InputTooLongError, ValidationError
from embedfleet.common.request import EmbedRequest
from embedfleet.worker.engine.chat import render
from embedfleet.worker.engine.encode import token_ids
from embedfleet.worker.engine.chunking import Specials, find_specials, split
from embedfleet.worker.engine.latechunking import plan_spans
from embedfleet.worker.engine.models import plaintext
from embedfleet.worker.engine.seam import Prepared

if TYPE_CHECKING:  # types only: a real model's module loads torch, and a null-model worker imports this one
    from embedfleet.worker.engine.models.base import LoadedModel

# Texts per tokenizer call when a round is tokenised together (1,024 corpus texts, MiniLM's tokenizer through
# its Rust backend, this 2-core machine): calls of 64-256 texts ran as fast as one call of the whole round when
# the machine was quiet and 1.5-2.5x faster when it was busy (the backend's thread pool then waits for its
# slowest thread, once per call); calls of 1-8 texts ran at about half speed (each call's set-up).
TOKENIZE_TEXTS = 64


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
            return token_ids(tokenizer, texts, add_special_tokens, keep)
        except Exception:  # noqa: BLE001 - tokenizers raise various errors for an impossible max_length
            pass
        finally:
            tokenizer.truncation_side = saved
    return token_ids(tokenizer, texts, add_special_tokens)


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


@dataclass
class _Plan:
    """A request's inputs up to the tokenizer call: the texts to tokenise and the settings to tokenise them
    with (`key`: requests with equal settings share one call in `prepare_many`), or token-id lists as given."""

    keep: int | None
    side: str
    late: bool
    texts: list[str] | None = None  # None: token-id inputs
    inputs: list[str] | None = None  # the texts as sent (late chunking locates its spans in them)
    prompt: str | None = None
    token_lists: list[list[int]] | None = None

    @property
    def key(self) -> tuple:
        return self.keep, self.side


def _plan(model: LoadedModel, request: EmbedRequest) -> _Plan:
    params, caps = request.params, model.caps
    keep = None if params.truncate_prompt_tokens is None else \
        (caps.max_model_len if params.truncate_prompt_tokens == -1 else params.truncate_prompt_tokens)
    side = params.truncation_side or caps.truncation_side
    late = params.chunk_size is not None or params.chunk_spans is not None
    if request.is_tokens:
        return _Plan(keep, side, late, token_lists=[list(ids) for ids in request.inputs])
    prompt = _prompt_text(model, request)
    inputs = [render(model.tokenizer, request.chat)] if request.chat is not None else list(request.inputs)
    as_message = getattr(model, "plain_text", None) if request.chat is None else None
    if as_message is not None:  # sentence-transformers 6's plain text on a chat-template folder: from here on
        # the rendered rows are token ids (chunks, spans), the prompt rendered inside them
        return _Plan(keep, side, late, token_lists=_as_messages(model, as_message, inputs, prompt, keep, side))
    texts = [prompt + text for text in inputs] if prompt else inputs
    return _Plan(keep, side, late, texts, inputs, prompt)


def prepare(model: LoadedModel, request: EmbedRequest) -> Prepared:
    """Tokenise a request already resolved against the model's caps.

    Texts get the prompt prepended (ST's `prompt + text`) and special tokens per `add_special_tokens`;
    token-id inputs are embedded exactly as given (no prompt, no special tokens, like vLLM). With
    `truncate_prompt_tokens` None an input longer than the model's max length raises
    InputTooLongError; -1 truncates to the max length, k to k tokens, from `truncation_side`.
    """
    plan = _plan(model, request)
    if plan.texts is not None:
        plan.token_lists = _tokenize(model, plan.texts, request.params.add_special_tokens, plan.keep, plan.side)
    return _checked(model, request, plan)


def prepare_many(model: LoadedModel, requests: list[EmbedRequest]) -> list[Prepared | Exception]:
    """`prepare` for a round of requests, tokenised together per group of requests that tokenise alike
    (special tokens, truncation length and side), in calls of TOKENIZE_TEXTS texts whatever the requests'
    sizes (a GPU waited for one call per request). Each request gets its
    Prepared or its own error; a group whose call fails is tokenised request by request, so that the input
    that broke it fails alone."""
    out: list[Prepared | Exception | None] = [None] * len(requests)
    plans: dict[int, _Plan] = {}
    groups: dict[tuple, list[int]] = {}
    for index, request in enumerate(requests):
        try:
            plans[index] = plan = _plan(model, request)
        except Exception as exc:  # noqa: BLE001 - handed back: the engine answers this request with it
            out[index] = exc
            continue
        if plan.texts is not None:
            groups.setdefault((request.params.add_special_tokens, *plan.key), []).append(index)
    for (add_special_tokens, keep, side), members in groups.items():
        texts = [text for index in members for text in plans[index].texts]
        try:
            token_lists = [ids for start in range(0, len(texts), TOKENIZE_TEXTS) for ids in
                           _tokenize(model, texts[start:start + TOKENIZE_TEXTS], add_special_tokens, keep, side)]
        except Exception:  # noqa: BLE001 - one bad input: tokenise the group's requests one by one below
            token_lists = None
        offset = 0
        for index in members:
            plan = plans[index]
            if token_lists is not None:
                plan.token_lists, offset = token_lists[offset:offset + len(plan.texts)], offset + len(plan.texts)
            else:
                try:
                    plan.token_lists = _tokenize(model, plan.texts, add_special_tokens, keep, side)
                except Exception as exc:  # noqa: BLE001 - this request fails alone
                    out[index] = exc
    for index, plan in plans.items():
        if out[index] is None:
            try:
                out[index] = _checked(model, requests[index], plan)
            except Exception as exc:  # noqa: BLE001 - handed back: the engine answers this request with it
                out[index] = exc
    return out


def _checked(model: LoadedModel, request: EmbedRequest, plan: _Plan) -> Prepared:
    """The request's token lists checked against the model's limits: cut, chunked or refused."""
    params, caps = request.params, model.caps
    keep, side, late, texts, token_lists = plan.keep, plan.side, plan.late, plan.texts, plan.token_lists
    prompt_length = 0
    if plan.prompt and not model.pooler.include_prompt:
        prompt_length = model.prompt_length(plan.prompt, params.add_special_tokens)

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
                        spans=plan_spans(model, request, token_lists, plan.inputs, plan.prompt))
    if long:
        return _chunked(model, request, texts, token_lists, long, prompt_length)
    return Prepared(list(token_lists), prompt_length)


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
