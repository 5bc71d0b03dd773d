"""Webhooks of async jobs: any gateway replica delivers them, none has to stay up for it.

POST /v1/jobs with a `webhook` enqueues the job with the shared webhook stream as its `reply_to` and
adds it to embedfleet:webhooks (a ZSET: the durable delivery list, common.protocol.keys). Every replica reads the
stream (an entry is a fast wake-up) and sweeps the list for jobs that are due (the backstop: no replica
was up when the result landed, the stream was trimmed or lost, or a replica died mid-delivery). To deliver,
a replica claims the job (SET NX with a lease, WEBHOOK_LEASE); a replica that dies lets the claim lapse and
the next sweep delivers again. Delivery is therefore at least once: a receiver dedupes on
X-Embedfleet-Job.

The request: POST <webhook>, the job's JSON (producer.gateway.jobs.results.job_body), headers
X-Embedfleet-Job (the job id), X-Embedfleet-Attempt (1, 2, ...), and X-Embedfleet-Signature-256:
`sha256=` + hex HMAC-SHA256 of the raw body keyed by --webhook-secret (GitHub's scheme). A 2xx ends the
delivery; a 5xx, 429, timeout or connection failure is retried (pauses 0.5 s, 1 s, 2 s, ...) up to
--webhook-attempts; any other status is the receiver's refusal and ends it.

Each attempt checks the URL again with this replica's policy (producer/gateway/jobs/webhookurls.py): the host
is resolved once, every address checked, and the connection made to a checked address; a refused URL or
address ends the delivery unsent. Redirects are not followed (a 3xx is a refusal), and logs name a
webhook by scheme://host[:port] only (its path and query may hold the receiver's tokens).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable

import httpx
import redis
import redis.asyncio as aioredis
from rq.job import Job

from embedfleet.common.errors import DecodeError
from embedfleet.common.names import valid_request_id
from embedfleet.common.protocol import keys
from embedfleet.common.redisclient import MAX_BLOCK, close_async
from embedfleet.producer.client.core import read_result
from embedfleet.producer.gateway.jobs.results import job_body
from embedfleet.producer.gateway.jobs.webhookurls import WebhookPolicy, WebhookRefusedError, loggable

log = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Embedfleet-Signature-256"
SWEEP_BATCH = 500  # due jobs one sweep looks at (the rest at the next)
CONCURRENT = 64  # deliveries in flight per replica


def sign(secret: str, body: bytes) -> str:
    """The signature header's value for `body`; receivers compare it with hmac.compare_digest."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


class Deliveries:
    """One replica's part in delivering webhooks on one Redis.

    Args:
        connection: the gateway's command client for that Redis.
        listen: a client of its own for the blocking read of the webhook stream.
        options_of: the job's answer options (Gateway.job_options), which hold its webhook URL.
        secret, attempts, timeout: --webhook-secret, --webhook-attempts, --webhook-timeout.
        sweep: seconds between sweeps of the delivery list; a job that is not done yet is looked at
            again after 6 sweeps (its stream entry normally comes first).
        policy: where webhooks may go (--webhook-allow-http, --webhook-allow-hosts).
    """

    def __init__(self, connection: aioredis.Redis, listen: aioredis.Redis,
                 options_of: Callable[[str], Awaitable[dict]], *, secret: str | None, attempts: int,
                 timeout: float, sweep: float, policy: WebhookPolicy, woken: bool = True):
        self.connection, self.listen = connection, listen
        self.options_of = options_of
        self.secret, self.attempts, self.timeout = secret, attempts, timeout
        # `woken`: answers wake the webhook stream. Not on a Redis Cluster (the stream lies in another slot
        # than the jobs): there every sweep looks at each job on the list until it is delivered.
        self.woken = woken
        self.sweep, self.recheck_after = sweep, (6 * sweep if woken else sweep)
        self.policy = policy
        # No redirects: a 3xx could point anywhere the policy refuses. No kept-alive connections: a pooled
        # connection is found by the address it went to, and one opened (and its certificate checked) for
        # one host name must not carry a request for another name at the same address.
        self.http = httpx.AsyncClient(timeout=timeout, follow_redirects=False,
                                      limits=httpx.Limits(max_keepalive_connections=0))
        self._slots = asyncio.Semaphore(CONCURRENT)
        self._tasks: set[asyncio.Task] = set()
        self._loops: list[asyncio.Task] = []

    async def register(self, job_id: str) -> None:
        """Put a just-enqueued job on the delivery list."""
        await self.connection.zadd(keys.WEBHOOKS_KEY, {job_id: time.time() + self.recheck_after})

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._loops = [loop.create_task(self._sweep(), name="webhook sweep")]
        if self.woken:
            self._loops.append(loop.create_task(self._listen(), name="webhook stream"))

    async def close(self) -> None:
        for task in [*self._loops, *self._tasks]:
            task.cancel()
        await asyncio.gather(*self._loops, *self._tasks, return_exceptions=True)
        await self.http.aclose()
        await close_async(self.listen)

    # -- finding jobs to deliver ---------------------------------------------------------------------
    async def _listen(self) -> None:
        last_id, backoff = "$", 0.5
        while True:
            try:
                replies = await self.listen.xread({keys.WEBHOOK_STREAM: last_id}, block=int(MAX_BLOCK * 1000))
                backoff = 0.5
            except (redis.ConnectionError, redis.TimeoutError) as exc:  # the sweep finds what we missed
                log.warning("webhook stream: Redis unreachable (%s); retrying in %.1f s", exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, MAX_BLOCK)
                continue
            for _, entries in replies:
                for entry_id, fields in entries:
                    last_id = entry_id
                    job_id = fields.get(b"id", b"")
                    if valid_request_id(job_id):
                        self._spawn(job_id.decode())

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(self.sweep * random.uniform(0.8, 1.2))  # replicas drift apart
            try:
                await self._sweep_once()
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                log.warning("webhook sweep: Redis unreachable (%s); next sweep in %.1f s", exc, self.sweep)

    async def _sweep_once(self) -> None:
        now = time.time()
        due = [i.decode() for i in await self.connection.zrangebyscore(keys.WEBHOOKS_KEY, "-inf", now, 0,
                                                                        SWEEP_BATCH)]
        if not due:
            return
        pipe = self.connection.pipeline(transaction=False)
        for job_id in due:
            pipe.exists(keys.result_key(job_id), Job.key_for(job_id))
        later = {}
        for job_id, alive in zip(due, await pipe.execute()):
            if not alive:  # neither a job nor a result: it expired unserved, or was never valid
                log.warning("webhook of job %s dropped: the job and its result have expired", job_id)
                await self.connection.zrem(keys.WEBHOOKS_KEY, job_id)
                continue
            later[job_id] = now + self.recheck_after  # not done yet, or being delivered: look again later
            self._spawn(job_id)
        await self.connection.zadd(keys.WEBHOOKS_KEY, later, xx=True)

    def _spawn(self, job_id: str) -> None:
        task = asyncio.get_running_loop().create_task(self._consider(job_id))
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:  # never silent; the sweep retries it
            log.error("webhook delivery failed", exc_info=task.exception())

    # -- delivering one --------------------------------------------------------------------------------
    async def _consider(self, job_id: str) -> None:
        """Deliver `job_id`'s webhook if its result is in, nobody else is delivering it, and it is still
        on the list."""
        async with self._slots:
            claim = keys.webhook_claim_key(job_id)
            blob = await self.connection.get(keys.result_key(job_id))
            if blob is None or not await self.connection.set(claim, b"1", nx=True, ex=keys.WEBHOOK_LEASE):
                return  # not done yet (the stream or a sweep comes back), or another replica has it
            try:
                if await self.connection.zscore(keys.WEBHOOKS_KEY, job_id) is None:
                    return  # delivered (or given up) already
                await self._deliver(job_id, blob)
                await self.connection.zrem(keys.WEBHOOKS_KEY, job_id)
            finally:
                with contextlib.suppress(redis.RedisError):
                    await self.connection.delete(claim)

    async def _deliver(self, job_id: str, blob: bytes) -> None:
        options = await self.options_of(job_id)
        url = options.get("webhook")
        if not url:
            log.warning("webhook of job %s dropped: its options name no webhook URL (expired or rewritten)",
                        job_id)
            return
        try:
            body = json.dumps(job_body(read_result(job_id, blob), options), separators=(",", ":")).encode()
        except DecodeError as err:
            log.warning("webhook of job %s dropped: its result is unreadable (%s)", job_id, err.message)
            return
        headers = {"Content-Type": "application/json", "User-Agent": "embedfleet-gateway",
                   "X-Embedfleet-Job": job_id, SIGNATURE_HEADER: sign(self.secret or "", body)}
        pause, where = 0.5, loggable(url)
        for attempt in range(1, self.attempts + 1):
            try:
                response = await self._post(url, body, {**headers, "X-Embedfleet-Attempt": str(attempt)})
                if response.is_success:
                    return
                why = f"HTTP {response.status_code}"
                if response.status_code != 429 and response.status_code < 500:
                    log.warning("webhook of job %s to %s refused (%s): not retried", job_id, where, why)
                    return
            except WebhookRefusedError as err:  # this replica's policy: no retry makes it pass
                log.warning("webhook of job %s to %s not sent: %s", job_id, where, err.message)
                return
            except (httpx.HTTPError, OSError, asyncio.TimeoutError) as exc:  # OSError: the name did not resolve
                why = f"{type(exc).__name__}: {exc}"
            if attempt < self.attempts:
                log.info("webhook of job %s to %s: attempt %d failed (%s); retrying in %.1f s", job_id, where,
                         attempt, why, pause)
                await asyncio.sleep(pause)
                pause *= 2
        log.warning("webhook of job %s to %s: gave up after %d attempts (%s)", job_id, where, self.attempts, why)

    async def _post(self, url: str, body: bytes, headers: dict) -> httpx.Response:
        """POST to an address checked just now: the host is resolved once and every address it resolves to
        is checked (webhookurls.py); the connection goes to one of them, with the URL's host name in the
        Host header and, over TLS, in SNI and the certificate check. Nothing looks the name up again, so
        a DNS answer that changes after the check (rebinding) reaches nothing."""
        target, addresses = await self.policy.resolve(url, self.timeout)
        if target.literal is not None:
            return await self.http.post(target.url, content=body, headers=headers)
        headers = {**headers, "Host": target.url.netloc.decode("ascii")}
        extensions = {"sni_hostname": target.host} if target.url.scheme == "https" else {}
        failed: httpx.ConnectError | None = None
        for address in addresses:  # the next checked address when one refuses the connection
            try:
                return await self.http.post(target.url.copy_with(host=str(address)), content=body,
                                            headers=headers, extensions=extensions)
            except httpx.ConnectError as exc:
                failed = exc
        raise failed
