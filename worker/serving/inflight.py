"""In-flight dedup across the fleet: a request identical to one that a worker is computing right now waits
for that one's answer and gets a copy of its bytes (under its own id), instead of computing again.

A worker that takes a cacheable request claims a marker for its digest (model identity, model, inputs,
params): `SET inflight:<digest> <id>` unless another request holds it. A request taken later whose marker
is held by another request that has no result yet becomes a follower: its worker keeps holding it (its
lease is renewed like any held job's) but parks it instead of running it. Each round, the worker looks at
its parked followers' leaders in one round trip:

    the leader's result is there and ok   -> the follower is answered with a copy (its own id, same bytes)
    the leader answered an error, was requeued (its worker releases the marker), its marker lapsed (its
    worker died: INFLIGHT_TTL), or the follower waited INFLIGHT_TTL -> the follower runs on its own

so no follower waits on a leader that will not answer. Identical requests in one round are not followers:
the engine's in-round dedup computes their inputs once. Requests with `cache: false` never attach.

Where the markers and the vector cache share a Redis (the default) a round's claims go in one pipeline with its
cache lookup, after it is tokenised (worker/serving/take.py): one round trip, not two, on every round's way to
the device; the rare round with a follower is then prepared again without it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import threading
import time
from dataclasses import dataclass

import redis

from embedfleet.common.codec import packb
from embedfleet.common.errors import DecodeError
from embedfleet.common.names import tag_of, valid_request_id
from embedfleet.common.policy import INFLIGHT_TTL
from embedfleet.common.protocol import dedup, keys, scripts
from embedfleet.common.request import EmbedRequest
from embedfleet.common.result import Result

log = logging.getLogger(__name__)

PARKED_POLL = 0.02  # seconds a take blocks while followers are parked: how soon they see their leader's answer

def request_digest(identity: str, request: EmbedRequest) -> str:
    """What makes two requests give the same bytes: the model identity, model, inputs and params."""
    text = packb([identity, request.model, request.inputs, request.params.model_dump(mode="json")])
    return hashlib.sha256(text).hexdigest()


@dataclass
class Claim:
    """A round's in-flight claims: marker -> the round's positions that have it, the id that claims each marker
    (its first request's), and the script's answer once sent (per marker, '' = leads, or the leader's id;
    None: not sent, or refused: no dedup this round)."""

    markers: dict[str, list[int]]
    ids: list[str]
    ttl: int
    leaders: list[str] | None = None

    def command(self) -> tuple:
        """The attach script as a raw command, for a pipeline that carries other reads too (steps.py)."""
        return scripts.INFLIGHT_ATTACH.command(list(self.markers), [self.ttl, *self.ids])

    def answer(self, reply, connection: redis.Redis) -> None:
        """The script's reply from that pipeline (an error reply: run alone once more, by source where the
        server lost the script; a refusal then means no dedup this round)."""
        try:
            if isinstance(reply, redis.exceptions.NoScriptError):
                reply = scripts.INFLIGHT_ATTACH(connection, list(self.markers), [self.ttl, *self.ids])
            elif isinstance(reply, Exception):
                raise reply
            self.leaders = dedup.attach_reply(reply)
        except redis.RedisError as exc:
            log.warning("in-flight dedup skipped for a round (%s)", exc)


@dataclass
class Parked:
    job: object  # common.protocol.records.Taken
    request: EmbedRequest
    leader: str
    marker: str
    since: float


class InFlight:
    """One worker's side of in-flight dedup: markers it leads, followers it parks. Used from the take
    stage (attach, poll), the finish and forward stages (release) and the heartbeat (renew): the markers it
    leads are under a lock; the parked followers are the take stage's alone."""

    def __init__(self, connection: redis.Redis, identity: str, ttl: int = INFLIGHT_TTL):
        self.connection = connection
        self.identity = identity
        self.ttl = ttl
        self.parked: list[Parked] = []
        self.leading: dict[str, str] = {}  # request id -> its marker key (under _lock)
        self._lock = threading.Lock()
        self.attached = 0  # followers answered with their leader's bytes
        self.let_go = 0  # followers that ran on their own (their leader did not answer ok)

    def block(self, block: float | None) -> float | None:
        """The take's blocking time: short while followers are parked, so that they are looked at soon."""
        if not self.parked:
            return block
        return PARKED_POLL if block is None else min(block, PARKED_POLL)

    def attach(self, jobs: list, requests: list[EmbedRequest]) -> tuple[list, list[EmbedRequest]]:
        """Claim markers for this round's cacheable requests; park the followers. Returns the jobs and
        requests to run now (leaders, uncacheable ones, and identical ones in this round)."""
        claim = self.claim(requests)
        if claim.markers:
            try:
                claim.leaders = dedup.inflight_attach(self.connection, list(claim.markers), claim.ids,
                                                           self.ttl)
            except redis.RedisError as exc:  # no dedup this round; the requests still run
                log.warning("in-flight dedup skipped for a round (%s)", exc)
        return self.settle(claim, jobs, requests)

    def claim(self, requests: list[EmbedRequest]) -> Claim:
        """The markers this round's cacheable requests claim (`attach`, or a claim sent on another round trip:
        `Claim.command`, answered with `Claim.answer`)."""
        markers: dict[str, list[int]] = {}  # marker -> this round's positions that have it, first first
        for position, request in enumerate(requests):
            if request.cache and request.part_of is None:  # a part answers into its request's join, not alone
                marker = keys.inflight_key(request_digest(self.identity, request), tag_of(request.id))
                markers.setdefault(marker, []).append(position)
        return Claim(markers, [requests[p[0]].id for p in markers.values()], self.ttl)

    def settle(self, claim: Claim, jobs: list, requests: list[EmbedRequest]) -> tuple[list, list[EmbedRequest]]:
        """Park the followers the claim's answer names (none when it has no answer: no dedup this round);
        the jobs and requests to run now."""
        if claim.leaders is None:
            return jobs, requests
        parked: set[int] = set()
        now = time.monotonic()
        for (marker, positions), leader in zip(claim.markers.items(), claim.leaders):
            if not leader:  # the first leads; the others of this round ride on the engine's in-round dedup
                with self._lock:
                    self.leading[requests[positions[0]].id] = marker
            elif valid_request_id(leader):
                for position in positions:
                    self.parked.append(Parked(jobs[position], requests[position], leader, marker, now))
                    parked.add(position)
        if not parked:
            return jobs, requests
        keep = [p for p in range(len(requests)) if p not in parked]
        return [jobs[p] for p in keep], [requests[p] for p in keep]

    def poll(self, everything: bool = False) -> tuple[list[tuple[object, EmbedRequest, Result]],
                                                       list[tuple[object, EmbedRequest]]]:
        """Parked followers whose wait is over: (answered with a copy of the leader's result, to run on
        their own). `everything`: the worker is stopping, every parked one is done waiting."""
        if not self.parked:
            return [], []
        try:
            with self.connection.pipeline(transaction=False) as pipe:
                for parked in self.parked:
                    pipe.get(keys.result_key(parked.leader))
                    pipe.get(parked.marker)
                replies = pipe.execute()
        except redis.RedisError as exc:
            if not everything:
                log.warning("could not look at parked followers' leaders (%s); looking again", exc)
                return [], []
            replies = [None, None] * len(self.parked)
        answered, run, waiting = [], [], []
        now = time.monotonic()
        for index, parked in enumerate(self.parked):
            raw, marker = replies[2 * index], replies[2 * index + 1]
            result = _leader_result(parked.leader, raw)
            if result is not None and result.ok:
                copy = dataclasses.replace(result, id=parked.request.id, finished_at=time.time())
                answered.append((parked.job, parked.request, copy))
            elif raw is not None or everything or marker != parked.leader.encode() \
                    or now - parked.since > self.ttl:
                run.append((parked.job, parked.request))
            else:
                waiting.append(parked)
        self.parked = waiting
        self.attached += len(answered)
        self.let_go += len(run)
        return answered, run

    def release(self, request_ids) -> None:
        """The leaders among these requests have answered (or were given back): drop their markers, so
        that their followers see the outcome and later identical requests lead anew."""
        with self._lock:
            done = [(self.leading.pop(i), i) for i in request_ids if i in self.leading]
        if not done:
            return
        try:
            dedup.inflight_release(self.connection, [m for m, _ in done], [i for _, i in done])
        except redis.RedisError as exc:  # the markers lapse within INFLIGHT_TTL
            log.warning("could not release %d in-flight markers (%s)", len(done), exc)

    def renew(self) -> None:
        """Keep the markers of the requests this worker leads alive (the heartbeat, while it computes)."""
        with self._lock:
            markers = list(self.leading.values())
        if markers:
            with self.connection.pipeline(transaction=False) as pipe:
                for marker in markers:
                    pipe.expire(marker, self.ttl)
                pipe.execute()


def _leader_result(leader: str, raw: bytes | None) -> Result | None:
    """The leader's stored result, if it is one and names the leader (what Redis holds is input)."""
    if raw is None:
        return None
    try:
        result = Result.decode(raw)
    except DecodeError:
        return None
    return result if result.id == leader else None
