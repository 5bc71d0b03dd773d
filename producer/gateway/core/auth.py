"""Bearer-key check: with API keys configured, every route but /health needs `Authorization: Bearer KEY`;
the key found is kept on the request, by name for its fair share (`request.state.api_key`, apikeys.py)
and as the owner of the jobs it creates (`request.state.job_owner`, owners.py)."""

from __future__ import annotations

import contextlib
import hmac

from fastapi import Depends, Request

from embedfleet.common.errors import AuthError
from embedfleet.producer.gateway.core.errors import RateLimitedError
from embedfleet.producer.gateway.core.owners import fingerprint
from embedfleet.producer.gateway.core.service import Gateway, gateway


async def require_key(request: Request, gw: Gateway = Depends(gateway)) -> None:
    request.state.api_key = request.state.job_owner = None
    accepted = gw.settings.keys
    if not accepted:
        return
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    given_bytes = given.strip().encode()
    found = None
    # compare_digest against every key: the time taken must not reveal how much of a guess was right
    for key in accepted:
        if hmac.compare_digest(given_bytes, key.encode()):
            found = key
    if scheme.lower() != "bearer" or found is None:
        raise AuthError("missing or wrong API key: send `Authorization: Bearer <key>`")
    request.state.api_key = accepted[found].name
    request.state.job_owner = fingerprint(found)


async def admit(request: Request, gw: Gateway = Depends(gateway)):
    """Hold the request against its key's rate and share until it is answered (429 rate_limited past them)."""
    name = getattr(request.state, "api_key", None)
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(gw.limiter.admit(name))
        except RateLimitedError:
            gw.metrics.keyed(name, "refused")
            raise
        gw.metrics.keyed(name, "admitted")
        yield
