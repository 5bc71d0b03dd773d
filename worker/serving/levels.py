"""A model's priority levels as one take source: the order each round reads the level queues in, with a
bounded share for the lower ones, and the rq schema calls routed to the queue each job came from.

A round comes from one level: the first, in the round's order, that has any work (a round of interactive
work carries no bulk work it would wait for). The share: rounds are counted; in N - 1 rounds of N the take
reads the levels highest first, in the Nth the lowest level first. So while bulk is non-empty it gets at
least one round in N (`--bulk-share`, default 4: a quarter of the rounds) however much interactive traffic
there is.

A bulk round gives way to interactive work. On the device, it pauses between two forward passes while a
round of interactive work runs, then goes on where it paused (nothing is lost or run twice). Still waiting
for the device, it goes back to the head of its queue (as a drain does: the delivery is not counted), unless
it is the share's round taken while interactive work was queued: that one only pauses. So an interactive
request waits for about one forward pass of bulk work, not for a round.

A take reads every level without waiting; only when all are empty does an idle worker block, on the
highest level's queue only (Redis can wait on one list without popping it) and for at most
LOWER_LEVEL_POLL seconds at a time, so work that lands on a lower level of an idle worker is taken within
that time. When the last take took no lower-level work and saw every lower level empty, the first read is
left out and the take blocks at once: a lower level's new work then waits as long as an idle worker's would
(one script run fewer per round for a worker that keeps up with its interactive work; a worker busy with
lower-level work reads every level first, as before).
"""

from __future__ import annotations

from collections import defaultdict

from redis import Redis

from embedfleet.common.policy import LEASE_SECONDS, RECOVER_LIMIT
from embedfleet.common.protocol.claims import RqSchema, take_from
from embedfleet.common.protocol.records import RQ_RECORDS, Answer, Finished, Recovered, Taken

BULK_SHARE = 4  # default --bulk-share: one round in this many reads the lowest level first
LOWER_LEVEL_POLL = 0.25  # seconds an idle worker blocks on the highest level before reading the others


class Levels:
    """RqSchemas of one worker over `queues` (highest level first), with the take order of the share."""

    def __init__(self, connection: Redis, queues: list[str], worker_name: str, *, result_ttl: int,
                 lease: float = LEASE_SECONDS, share: int = BULK_SHARE, records: str = RQ_RECORDS[0]):
        if share < 2:
            raise ValueError(f"the bulk share must be at least 2 (one round in N reads bulk first), got {share}")
        self.connection = connection
        self.records = records  # what the scripts write of rq's own bookkeeping (--rq-records)
        self.schemas = {queue: RqSchema(connection, queue, worker_name, result_ttl=result_ttl, lease=lease,
                                        records=records) for queue in queues}
        self.order = list(self.schemas.values())
        self.share = share
        self.rounds = 0  # rounds that took something
        self.lower_first = False  # whether the last take read the lowest level first (the share's round)
        self.share_round = False  # ... and interactive work was queued then: that round does not yield
        self.took_lower = True  # whether the last take took lower-level work (then the next reads all first)
        self.state = ""  # the rq worker state the takes last wrote (lean: written as it changes, by the take)

    @property
    def queue_keys(self) -> list[str]:
        return [schema.queue_key for schema in self.order]

    def take(self, max_jobs: int, block: float | None, before=None, max_tokens: int = 0,
             top: int = 0) -> tuple[bool, list[Taken]]:
        """(suspended, taken ids) in this round's order of levels (see the module docstring); `max_tokens`:
        the round ends with the job whose estimated tokens reach it (0: `max_jobs` alone). `top`: read only
        the `top` highest levels, highest first, without waiting and outside the share's count (work that
        arrived behind a round of that level, to run between two of its passes); 0: every level."""
        if top:
            self.lower_first = self.share_round = False
            return take_from(self.order[:top], max_jobs, None, before, max_tokens)
        order = self.order
        quiet_below = not self.took_lower and all(schema.known_empty for schema in self.order[1:])
        # the share's round reads the lowest level first, unless the last take saw nothing there to share
        self.lower_first = len(order) > 1 and self.rounds % self.share == self.share - 1 and not quiet_below
        if self.lower_first:
            order = order[-1:] + order[:-1]
        # the rq worker state (lean): busy once it claims jobs, idle once a take that may wait claims none
        busy = "busy" if self.records == "lean" and self.state != "busy" else ""
        idle = "idle" if self.records == "lean" and self.state != "idle" and block is not None else ""
        if len(order) == 1 or block is None:
            suspended, taken = take_from(order, max_jobs, block, before, max_tokens, (busy, idle))
        elif quiet_below:  # nothing below to read first: wait on the highest level
            suspended, taken = take_from(self.order, max_jobs, min(block, LOWER_LEVEL_POLL), before, max_tokens,
                                         (busy, idle))
        else:  # Redis waits on one list only: take what is there at any level, and only if none, wait
            suspended, taken = take_from(order, max_jobs, None, before, max_tokens, (busy, ""))
            if not taken and not suspended:  # all empty: wait on the highest level (not the share's first)
                suspended, taken = take_from(self.order, max_jobs, min(block, LOWER_LEVEL_POLL), None, max_tokens,
                                             (busy, idle))
        claimed = any(job.claimed for job in taken)
        if suspended:
            self.state = ""  # rq wrote `suspended`: the next take writes its state again
        elif claimed and busy:
            self.state = "busy"
        elif not claimed and idle:
            self.state = "idle"
        if taken:
            self.rounds += 1
        self.took_lower = self.lower(taken)
        # the share's round holds its place only when interactive work was there to hold it against
        self.share_round = self.lower_first and bool(taken) and self.higher_waiting()
        return suspended, taken

    def lower(self, taken: list[Taken]) -> bool:
        """Whether a round just taken holds lower-level work only (it pauses between its passes for
        higher-level work)."""
        top = self.order[0].queue
        return len(self.order) > 1 and bool(taken) and all(t.queue != top for t in taken)

    def preemptible(self, taken: list[Taken]) -> bool:
        """Whether a round just taken goes back to its queue if higher-level work arrives before it reaches
        the device: lower-level work that is not the lower levels' share."""
        return self.lower(taken) and not self.share_round

    def higher_waiting(self) -> bool:
        """Whether the highest level has jobs waiting (one LLEN)."""
        return self.connection.llen(self.order[0].queue_key) > 0

    def levels_up_to(self, lower: bool) -> int:
        """How many levels, from the highest, hold work that may run between the passes of a round of the
        highest level (`lower` False: that level alone) or of a lower one (`lower`: every level)."""
        return len(self.order) if lower else 1

    def waiting(self, top: int) -> bool:
        """Whether any of the `top` highest levels has jobs waiting (one LLEN each, one round trip)."""
        if top == 1:
            return self.higher_waiting()
        with self.connection.pipeline(transaction=False) as pipe:
            for schema in self.order[:top]:
                pipe.llen(schema.queue_key)
            return any(pipe.execute())

    def queued(self) -> int:
        """Job ids waiting on all levels."""
        with self.connection.pipeline(transaction=False) as pipe:
            for key in self.queue_keys:
                pipe.llen(key)
            return sum(pipe.execute())

    def finish(self, answers: list[Answer], working_seconds: float) -> Finished:
        """One script run per level the answers' jobs came from, their counts summed."""
        done = Finished()
        for queue, group in _by_queue(answers, lambda a: a.taken.queue).items():
            done += self._schema(queue).finish(group, working_seconds)
        return done

    def refresh(self, held: list[Taken]) -> int:
        return sum(self._schema(queue).refresh(group) for queue, group in _by_queue(held, _queue_of).items())

    def recover(self, limit: int = RECOVER_LIMIT) -> list[Recovered]:
        return [r for schema in self.order for r in schema.recover(limit)]

    def give_back(self, jobs: list[Taken]) -> int:
        return sum(self._schema(queue).give_back(group) for queue, group in _by_queue(jobs, _queue_of).items())

    def _schema(self, queue: str) -> RqSchema:
        return self.schemas.get(queue) or self.order[0]  # "" (a Taken built by hand): the first level


def _queue_of(taken: Taken) -> str:
    return taken.queue


def _by_queue(items: list, queue_of) -> dict[str, list]:
    groups: dict[str, list] = defaultdict(list)
    for item in items:
        groups[queue_of(item)].append(item)
    return groups
