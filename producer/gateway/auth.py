"""Bearer-key check: with an API key configured, every route but /health needs `Authorization: Bearer KEY`."""

from __future__ import annotations

import hmac

from fastapi import Depends, Request

from common.errors import AuthError
from producer.gateway.service import Gateway, gateway


async def require_key(request: Request, gw: Gateway = Depends(gateway)) -> None:
    expected = gw.settings.api_key
    if not expected:
        return
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    # compare_digest: the time taken must not reveal how much of a guessed key was right
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), expected.encode()):
        raise AuthError("missing or wrong API key: send `Authorization: Bearer <key>`")
