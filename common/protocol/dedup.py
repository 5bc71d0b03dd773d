"""In-flight dedup (worker/serving/inflight.py): identical requests taken meanwhile follow the one a worker is
computing. Its marker, embedfleet:inflight:<digest>, holds the leader's id; the scripts
(scripts/inflightattach.lua, inflightrelease.lua) claim and free markers, each within one slot with the
leader's result."""

from __future__ import annotations

import redis

from embedfleet.common.protocol import scripts
from embedfleet.common.protocol.records import reply_text


def inflight_attach(connection: redis.Redis, markers: list[str], leaders: list[str], ttl: int) -> list[str]:
    """Per marker: '' (the request given leads it now) or the id of the request it follows."""
    return attach_reply(scripts.INFLIGHT_ATTACH(connection, markers, [ttl, *leaders]))


def attach_reply(reply: list) -> list[str]:
    """The in-flight attach script's reply, per marker ('' or a leader's id; checked where it is used)."""
    return [reply_text(leader) for leader in reply]


def inflight_release(connection: redis.Redis, markers: list[str], leaders: list[str]) -> int:
    return int(scripts.INFLIGHT_RELEASE(connection, markers, leaders))
