"""What a client remembers of the ids it submitted, for the last REMEMBERED_IDS of them: the partition each went
to (Placements; a sharded client asks every partition only for ids it did not send) and how each wakes (Sent)."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from embedfleet.common.protocol import keys


REMEMBERED_IDS = 100_000  # request ids whose shard a sharded client remembers (others are looked up)


class Placements:
    """Request id -> the URL of the shard it was sent to, for the last REMEMBERED_IDS ids (a sharded client
    asks every shard only for ids it did not send)."""

    def __init__(self, size: int = REMEMBERED_IDS):
        self.size = size
        self._urls: OrderedDict[str, str] = OrderedDict()

    def get(self, request_id: str) -> str | None:
        return self._urls.get(request_id)

    def remember(self, request_ids: list[str], url: str) -> None:
        for request_id in request_ids:
            self._urls[request_id] = url
        while len(self._urls) > self.size:
            self._urls.popitem(last=False)


@dataclass(frozen=True)
class SentTo:
    """How a request this client submitted wakes: `stream`, its reply stream, or None: its notify list."""

    stream: str | None


class Sent:
    """Request id -> SentTo, for the last REMEMBERED_IDS ids this client submitted: a wait on one of them
    knows how it wakes without reading its job."""

    def __init__(self, size: int = REMEMBERED_IDS):
        self.size = size
        self._ids: OrderedDict[str, SentTo] = OrderedDict()

    def get(self, request_id: str) -> SentTo | None:
        return self._ids.get(request_id)

    def remember(self, request_ids: list[str], reply_to: str | None) -> None:
        sent = SentTo(reply_to if keys.is_reply_stream_key(reply_to) else None)
        for request_id in request_ids:
            self._ids[request_id] = sent
        while len(self._ids) > self.size:
            self._ids.popitem(last=False)
