"""One Redis (shard) of an AsyncProducer: its command connections, the wait hub of the requests that wake there
(producer/client/waiters.py), the two listeners that wake it (replies.py, notify.py) and its coalesced submits
(asubmit.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

import redis.asyncio as aioredis

from embedfleet.common.errors import UnavailableError
from embedfleet.common.redisclient import close_async, connect_async
from embedfleet.producer.client import asubmit
from embedfleet.producer.client.notify import NotifyListener
from embedfleet.producer.client.replies import ReplyListener
from embedfleet.producer.client.waiters import WaitHub

COMMAND_CONNECTIONS = 2  # per Redis: submits and reads share them (a WATCH transaction holds one briefly)


@dataclass
class Link:
    """One Redis (shard) of the fleet: short commands, the wait hub, and the two listeners that wake it."""

    url: str
    status: object  # the producer's status coroutine function
    max_queue_depth: int | None
    tag: str = ""  # on a Redis Cluster: the hash tag of the models it serves (names.slot_tag); '' else
    shared: aioredis.Redis | None = None  # the command connections of the URL's first link, if not its own
    redis: aioredis.Redis = field(init=False)
    hub: WaitHub = field(init=False)
    replies: ReplyListener = field(init=False)
    notify: NotifyListener = field(init=False)
    submitter: asubmit.Submitter = field(init=False)

    def __post_init__(self):
        self.redis = self.shared or connect_async(self.url, max_connections=COMMAND_CONNECTIONS)
        self.hub = WaitHub(self.redis, self.status)
        self.replies = ReplyListener(connect_async(self.url, max_connections=1), self.hub, self.redis, self.tag)
        self.notify = NotifyListener(lambda: connect_async(self.url, max_connections=1), self.redis, self.hub,
                                     self.tag)
        self.hub.notify, self.hub.replies = self.notify, self.replies
        self.submitter = asubmit.Submitter(self.redis, self.max_queue_depth, self.tag)

    async def close(self) -> None:
        self.hub.close(UnavailableError("the producer was closed while waiting for a result"))
        await self.submitter.close()
        await self.notify.close()
        await self.replies.close()
        if self.shared is None:
            await close_async(self.redis)

