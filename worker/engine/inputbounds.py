"""Bounds before work: a text input's length judged from a bounded prefix, before the tokenizer reads it whole.

A text's tokens cannot be counted from its characters alone (a 50,000-character word is one WordPiece [UNK]; one
CJK character is up to three byte-level BPE tokens), so the tokenizer reads a window of the text: 8 characters
per token of the limit first (MIN_TEXT_WINDOW at least), four times that while the window still reads as no
more than the limit, up to CHARS_PER_TOKEN per token (common/bounds.py). The window is cut at a run of
whitespace, where every tokenizer in use (WordPiece, byte-level BPE, SentencePiece's Metaspace) ends a word, so
its tokens are the text's first tokens exactly: more than the limit there is more than the limit in the whole
text (refused), and a truncation of the window equals the truncation of the whole text (embedded from the
window). A text of more than CHARS_PER_TOKEN characters per token of its limit that still reads as no more than
the limit is made of overlong words or whitespace: refused without truncation, cut to that many characters with
it. So a refused or truncated input costs at most ~CHARS_PER_TOKEN x its limit in characters of tokenizing,
whatever its size.

Also here: a text read mostly as the tokenizer's unknown token (a word over WordPiece's 100 characters, or
characters outside the vocabulary) is refused with a word, not embedded as the [UNK] vector that every such
text shares; and transformers' "Token indices sequence length is longer than the specified maximum" warning,
which quotes the tokenizer's limit and not the model's, is silenced: our own input_too_long error says it.
"""

from __future__ import annotations

import copy
import re
import weakref

from embedfleet.common.bounds import CHARS_PER_TOKEN, MIN_TEXT_WINDOW, most_chars, text_limit
from embedfleet.common.errors import InputTooLongError, ValidationError
from embedfleet.common.request import EmbedRequest

FIRST_CHARS_PER_TOKEN = 8  # English averages 4-5 characters per token: most long texts are judged at once
GROWTH = 4
MARGIN = 16  # tokens past the limit the window must hold: a window cut inside a word may count that word apart
UNKNOWN_SHARE = 0.5  # refused when unknown tokens cover more than this share of a text's non-space characters
_LONG_WORD = re.compile(rf"\S{{{CHARS_PER_TOKEN}}}")  # only such texts can read as mostly [UNK] from one word
_LENGTH_WARNING = "sequence-length-is-longer-than-the-specified-maximum"


def bound_inputs(model, request: EmbedRequest) -> EmbedRequest:
    """The request, refused (InputTooLongError) when a text is known too long from a bounded window of it, with
    each text that a truncation cuts replaced by the window it is cut from (same tokens, bounded work)."""
    params, caps = request.params, model.caps
    if getattr(model, "tokenizer", None) is None or request.is_tokens or request.chat is not None \
            or params.task == "detokenize":  # the null model has no tokenizer; token ids are counted at submit
        return request
    _quiet(model.tokenizer)
    keep = None if params.truncate_prompt_tokens is None or params.task == "tokenize" else \
        (caps.max_model_len if params.truncate_prompt_tokens == -1 else params.truncate_prompt_tokens)
    late = params.chunk_size is not None or params.chunk_spans is not None
    if keep == 0 or (late and keep is not None):  # late chunking maps character spans: its text is read whole
        return request
    if keep is not None:
        limit, what = keep, None
    else:
        limit = text_limit(caps, params)
        what = f"the maximum {limit}" if limit == caps.max_model_len else f"the max_embed_len {limit}"
    side = (params.truncation_side or caps.truncation_side) if keep is not None else "right"
    check_unknown = params.task != "tokenize" and model.tokenizer.unk_token_id is not None
    update = {}
    for field in ("inputs", "text_pair"):
        texts = getattr(request, field)
        if texts is None:
            continue
        bounded = [_bounded(model, text, limit, side, what, index, check_unknown, params.task)
                   for index, text in enumerate(texts)]
        if any(new is not old for new, old in zip(bounded, texts)):
            update[field] = bounded
    return request.model_copy(update=update) if update else request


def _bounded(model, text: str, limit: int, side: str, what: str | None, index: int, check_unknown: bool,
             task: str) -> str:
    """`text`, or the window a truncation to `limit` tokens reads it from; raises when it is known too long."""
    most = most_chars(limit)
    window = max(FIRST_CHARS_PER_TOKEN * (limit + MARGIN), MIN_TEXT_WINDOW)  # below it: whole, exact counts
    while len(text) > window:
        piece = _window(text, window, side)
        count = len(_encode(model.tokenizer, piece).ids)
        if count > limit + MARGIN:
            if what is not None:
                raise _too_long(model, index, f"more than {limit} tokens (at least {count} in its first "
                                f"{len(piece):,} characters of {len(text):,})", what, task)
            return _checked(model, piece, index, check_unknown, len(text))
        if window >= most:  # overlong words or whitespace: say so if that is what it is
            piece = _checked(model, piece, index, check_unknown, len(text))
            if what is not None:
                raise _too_long(model, index, f"{len(text):,} characters (the most read of one input is "
                                f"{CHARS_PER_TOKEN} per token: {most:,})", what, task)
            return piece
        window = min(window * GROWTH, most)
    return _checked(model, text, index, check_unknown)


def _window(text: str, size: int, side: str) -> str:
    """The first (right truncation) or last (left) ~`size` characters of `text`, cut at a run of whitespace in
    its far half when there is one: the window then tokenises as the text's own first (last) tokens."""
    if side == "left":
        start = len(text) - size
        for i in range(start, start + size // 2):
            if text[i].isspace():
                while i + 1 < len(text) and text[i + 1].isspace():
                    i += 1
                return text[i:]  # one whitespace before the first word, as the text has it
        return text[start:]
    for i in range(size - 1, size // 2, -1):
        if text[i].isspace():
            while i > 0 and text[i - 1].isspace():
                i -= 1
            return text[:i] if i else text[:size]  # nothing but whitespace before it: no word to cut at
    return text[:size]


def _checked(model, text: str, index: int, check_unknown: bool, whole: int | None = None) -> str:
    """`text`, unless its tokenizer reads it mostly as the unknown token: that vector says nothing of the text
    (every such text gets the same one), so the user is told instead (vLLM and TEI embed it silently)."""
    if not check_unknown or not _LONG_WORD.search(text):
        return text
    tokenizer = model.tokenizer
    encoding = _encode(tokenizer, text)
    unknown = sum(end - start for token, (start, end) in zip(encoding.ids, encoding.offsets)
                  if token == tokenizer.unk_token_id)
    visible = len(text) - sum(1 for c in text if c.isspace())
    if visible and unknown > UNKNOWN_SHARE * visible:
        of = f"its {visible:,} non-space characters" if whole is None else \
            f"the {visible:,} non-space characters of its first {len(text):,} (of {whole:,})"
        raise ValidationError(
            f"input {index}: {unknown:,} of {of} read as the unknown token "
            f"{tokenizer.unk_token} for model '{model.caps.name}' (its tokenizer reads a word of more than "
            f"{CHARS_PER_TOKEN} characters, or characters outside its vocabulary, as {tokenizer.unk_token}), so its "
            "embedding would say nothing of the text: split long words with spaces", param="input")
    return text


class _Ids:
    def __init__(self, ids, offsets):
        self.ids, self.offsets = ids, offsets


_CORES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _encode(tokenizer, text: str):
    """The text's own tokens (no special tokens) with their character offsets, from a copy of the fast
    tokenizer's Rust core where there is one: no transformers length warning, no Python objects per token, and
    none of the truncation that transformers leaves set on the shared core (it would cap the count)."""
    core = _CORES.get(tokenizer)
    if core is None and getattr(tokenizer, "backend_tokenizer", None) is not None:
        core = copy.deepcopy(tokenizer.backend_tokenizer)
        core.no_truncation()
        core.no_padding()
        _CORES[tokenizer] = core
    if core is not None:
        return core.encode(text, add_special_tokens=False)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return _Ids(ids, [(0, 0)] * len(ids))  # a slow tokenizer: no offsets, so no unknown-share check


def _too_long(model, index: int, has: str, what: str, task: str) -> InputTooLongError:
    """`what` names the limit. /tokenize reads no more of an input than the embedding routes, and never truncates."""
    hint = " (/tokenize too): shorten it" if task == "tokenize" else \
        ": shorten it, or send truncate_prompt_tokens=-1 to truncate to the maximum"
    return InputTooLongError(f"input {index} has {has}, more than {what} of model '{model.caps.name}'{hint}. Please "
                             "reduce the length of the input prompt.", param="input")


def _quiet(tokenizer) -> None:
    """Mark transformers' once-per-tokenizer length warning as given: it quotes the tokenizer's limit (512 for
    MiniLM), not the model's (256), and the input_too_long error says what the user needs."""
    warnings = getattr(tokenizer, "deprecation_warnings", None)
    if isinstance(warnings, dict):
        warnings[_LENGTH_WARNING] = True
