"""The bounds of every integer a request carries, of a request's encoded size, and of the work refusing a list.

Each bound means something for its field and keeps the value packable by msgpack, which refuses integers
past 64 bits: an unbounded one would fail the enqueue (and, coalesced, every request enqueued with it)
instead of failing alone. A value out of bounds is refused where it enters, with a message naming the
parameter, the value and what is allowed. The checks are pydantic validators shared by the Python models
(common.params, common.request) and the gateway's request bodies, so one mistake reads the same both ways.
"""

from __future__ import annotations

from typing import Annotated, TypeVar

from pydantic import AfterValidator, Field

from embedfleet.common.capabilities import MAX_EMBED_LEN

INT32_MAX = 2**31 - 1
INT32_MIN = -(2**31)
# Vocabularies are far smaller (the largest multilingual ones hold ~250k tokens); the model's own vocabulary
# size is checked when the request is verified against it.
MAX_TOKEN_ID = INT32_MAX
MAX_CHAR_OFFSET = INT32_MAX  # a character offset into a text, which is far shorter (MAX_REQUEST_BYTES)
MAX_TOKENS = MAX_EMBED_LEN  # the most tokens one input may have on any worker (--max-embed-len's ceiling)
MAX_DIMENSIONS = 1 << 16  # the widest embedding models have 4,096 to 12,288 dimensions
MAX_UNIX_TIME = 253402300799.0  # 9999-12-31T23:59:59Z: a timestamp in milliseconds lies past it
MAX_TIMEOUT = 10 * 365 * 24 * 3600  # seconds; a request waits in its queue a day at most (policy.JOB_TTL)

# The largest request a producer enqueues, msgpack-encoded (EmbedRequest.encode refuses more). It is twice
# the gateway's default body limit (8 MiB of JSON, which never packs larger) and holds ~16 inputs of the
# longest a worker embeds (MAX_TOKENS tokens, ~4 MiB of text), or 2,048 inputs of 8 KiB: OpenAI allows 2,048
# inputs and 300k tokens (~1.2 MB) a request. Workers size their decompression of job data by it.
MAX_REQUEST_BYTES = 16 << 20


def shown(value) -> str:
    """A number as an error message quotes it: an integer's digits, or its size when the digits would flood
    the message (Python refuses to print more than 4,300 digits at all); anything else as repr()."""
    if not isinstance(value, int) or isinstance(value, bool):
        return repr(value)
    return str(value) if abs(value) < 10**30 else f"an integer of {value.bit_length()} bits"


def bounded_int(what: str, low: int, high: int, allowed: str):
    """An int field type refusing values outside [low, high]: "<what> must be <allowed>, got <value>"; the
    bounds show in the gateway's OpenAPI schema."""

    def check(value: int) -> int:
        if not low <= value <= high:
            raise ValueError(f"{what} must be {allowed}, got {shown(value)}")
        return value

    return Annotated[int, AfterValidator(check), Field(json_schema_extra={"minimum": low, "maximum": high})]


def token_id_problem(inputs) -> str | None:
    """Where a list of token-id lists holds an id outside 0..MAX_TOKEN_ID, for an error message; else None."""
    for i, ids in enumerate(inputs):
        if ids and (min(ids) < 0 or max(ids) > MAX_TOKEN_ID):  # min/max: a million ids in milliseconds
            j, token = next((j, t) for j, t in enumerate(ids) if not 0 <= t <= MAX_TOKEN_ID)
            return (f"token id {shown(token)} (input {i}, position {j}) is out of range: allowed is 0 to "
                    f"{MAX_TOKEN_ID}")
    return None


TokenId = bounded_int("a token id", 0, MAX_TOKEN_ID, f"0 to {MAX_TOKEN_ID}")


# A list's validation stops at its first bad item (pydantic's FailFast, issue 49): without it, a body of
# 1,000,000 wrong items under the byte limit had pydantic and FastAPI build 1,000,000 error objects on the
# gateway's event loop (19 s on /score). A Field, not FailFast(): FailFast() is unhashable, and `X | Annotated[...,
# FailFast()]` raises. In a union each member stops at its own first bad item: one error per member.
FAIL_FAST = Field(fail_fast=True)
T = TypeVar("T")
FailFastList = Annotated[list[T], FAIL_FAST]


# A text's length in characters says nothing exact about its tokens (a 50,000-character word is one WordPiece
# [UNK]), but no tokenizer in use covers more than ~100 characters with one token (WordPiece's longest word):
# a text of more characters than that per token of its limit is over the limit, or made of words too long to
# read. The producer refuses such a text at submit when nothing may be cut; the worker reads at most that much
# of any text (worker/engine/inputbounds.py), and tokenises whole any text of up to MIN_TEXT_WINDOW characters.
CHARS_PER_TOKEN = 100
MIN_TEXT_WINDOW = 16_384


def most_chars(tokens: int) -> int:
    """The most characters of one text read for a limit of `tokens` tokens."""
    return max(CHARS_PER_TOKEN * tokens, MIN_TEXT_WINDOW)


def text_limit(caps, params) -> int:
    """The most tokens one text of a request may hold untruncated: the model's max length, or its max_embed_len
    where long inputs are embedded in chunks (never for late chunking, nor a cross-encoder's pairs)."""
    late = params.chunk_size is not None or params.chunk_spans is not None
    pairs = params.task == "score" and caps.pooling == "classifier"
    return caps.max_model_len if late or pairs or not caps.max_embed_len else caps.max_embed_len


def long_text_problem(texts, tokens: int) -> tuple[int, int] | None:
    """(the index, the length) of the first text longer than most_chars(tokens), for an input_too_long; else None."""
    most = most_chars(tokens)
    return next(((index, len(text)) for index, text in enumerate(texts or ()) if len(text) > most), None)
