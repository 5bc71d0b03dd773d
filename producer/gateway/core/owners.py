"""Async jobs belong to the API key that created them (issue #19).

With API keys configured, a job's answer options (embedfleet:job:<id>, common.protocol.keys) carry its
owner: a fingerprint of the key, never the key. GET /v1/jobs/{id}, DELETE /v1/jobs/{id} and the events
stream show another key's job exactly as a job that does not exist (the same 404 body, the same
`not_found` event): an id leaks nothing, not even that it exists. A job without options (they expired
with its result, or it was not created through a gateway) has no owner to match and is not found either.
Without keys nothing is checked: every job is everyone's, as before.
"""

from __future__ import annotations

import hashlib
import hmac

from fastapi import Request

from embedfleet.common.errors import NotFoundError, echo

_LABEL = b"embedfleet job owner"  # this fingerprint is for nothing else


def fingerprint(key: str) -> str:
    """The owner stored for jobs created with `key`: HMAC-SHA256 keyed by the key, so that it cannot be
    turned back into the key (nor matched against a list of guesses without computing each)."""
    return hmac.new(key.encode(), _LABEL, hashlib.sha256).hexdigest()


def owner_of(request: Request) -> str | None:
    """The fingerprint of the request's key (auth.require_key found it); None on a gateway without keys."""
    return getattr(request.state, "job_owner", None)


def no_such_job(job_id: str) -> NotFoundError:
    """What every job route answers for an id that names no job this caller may see."""
    return NotFoundError(f"no job with id {echo(job_id)} (never submitted, or its result expired)", param="id")


def may_see(options: dict | None, owner: str | None, keyed: bool) -> bool:
    """Whether a caller whose key has fingerprint `owner` sees a job with these stored options (None:
    none stored) on a gateway with (`keyed`) or without API keys."""
    if not keyed:
        return True
    stored = options.get("owner") if options else None
    return isinstance(stored, str) and owner is not None and hmac.compare_digest(stored, owner)
