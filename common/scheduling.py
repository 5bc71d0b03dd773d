"""Per-request scheduling: the priority level a request is queued at, and the deadline past which it is
not computed (issue #10).

Priority follows vLLM's `priority` field (an integer, lower = served sooner, default 0) and also takes the
level names. Levels are queues of the same model (common.names.PRIORITIES, highest first):

    "interactive", None, or an integer <= 0   -> interactive (the model's queue as it always was)
    "bulk", or an integer >= 1                -> bulk        (<queue>@bulk)

A worker takes from the higher level first and gives the lower one a bounded share (worker/serving/levels.py).

A deadline is an absolute unix time (`deadline`) or seconds from submit (`timeout`); with both, the
earlier wins. A request still queued when its deadline passes is answered `expired` and never computed;
the worker compares it with its own clock, so producer and worker clocks should agree (NTP).

Queued tokens (the autoscaling gauge) are estimated where the request is made, without a tokenizer: a
token-id input counts its ids, a text one token per 4 UTF-8 bytes (OpenAI's rule of thumb for English; CJK
and code run higher) plus 2 for the special tokens.
"""

from __future__ import annotations

import math

from embedfleet.common.bounds import INT32_MAX, INT32_MIN, MAX_TIMEOUT, MAX_UNIX_TIME, shown
from embedfleet.common.errors import ValidationError
from embedfleet.common.names import PRIORITIES
from embedfleet.common.request import EmbedRequest

DEFAULT_PRIORITY = PRIORITIES[0]


def priority_level(priority: str | int | None) -> str:
    """The level (one of common.names.PRIORITIES) of a request's `priority`; raises ValidationError."""
    if priority is None:
        return DEFAULT_PRIORITY
    if isinstance(priority, str):
        if priority in PRIORITIES:
            return priority
    elif isinstance(priority, int) and not isinstance(priority, bool):
        if not INT32_MIN <= priority <= INT32_MAX:  # vLLM's priority is a 32-bit int too
            raise ValidationError(f"`priority` must be an integer from {INT32_MIN} to {INT32_MAX} (<= 0: interactive, "
                                  f">= 1: bulk), or a level name; got {shown(priority)}", param="priority")
        return PRIORITIES[0] if priority <= 0 else PRIORITIES[-1]  # vLLM: lower value, higher priority
    raise ValidationError(f"`priority` must be one of {', '.join(map(repr, PRIORITIES))} or an integer "
                          f"(<= 0: interactive, >= 1: bulk; lower is served sooner, as in vLLM); got {priority!r}",
                          param="priority")


def resolve_deadline(deadline: float | None, timeout: float | None, now: float) -> float | None:
    """The absolute deadline of a request submitted at `now`, or None; raises ValidationError."""
    found = []
    if deadline is not None:
        if not _number(deadline) or not 0 < deadline <= MAX_UNIX_TIME:  # past it: milliseconds, most likely
            raise ValidationError(f"`deadline` must be an absolute unix time in seconds (e.g. {now + 60:.0f}), at "
                                  f"most {MAX_UNIX_TIME:.0f} (the year 9999); got {shown(deadline)}",
                                  param="deadline")
        if deadline <= now:
            raise ValidationError(f"`deadline` {deadline!r} has already passed (now is {now:.3f}); send a later "
                                  "unix time, or `timeout` in seconds from now", param="deadline")
        found.append(float(deadline))
    if timeout is not None:
        if not _number(timeout) or not 0 < timeout <= MAX_TIMEOUT:
            raise ValidationError(f"`timeout` must be a positive number of seconds from submit, at most {MAX_TIMEOUT} "
                                  f"(10 years), got {shown(timeout)}", param="timeout")
        found.append(now + float(timeout))
    return min(found) if found else None


def _number(value) -> bool:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int too large for a float
        return False


def estimate_tokens(request: EmbedRequest) -> int:
    """The request's tokens as estimated without its model's tokenizer (see the module docstring)."""
    if request.is_tokens:
        return sum(len(ids) for ids in request.inputs)
    return sum(len(text.encode("utf-8", "surrogatepass")) // 4 + 2 for text in request.inputs)
