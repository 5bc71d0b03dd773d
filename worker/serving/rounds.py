"""A round: the jobs one take returned, on their way through the pipeline (worker/serving/pipeline.py), and
the decisions about each job that need no Redis: which run, and what every other one is answered.

    triage    decode each taken job; answer now the ones that cannot run (poison, unreadable, expired,
              changed by hand, cancelled) and keep the rest runnable, in order
    answers   after the engine: each runnable job's answer from its result (an engine that failed the
              whole round answers each request with that error)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from embedfleet.common.errors import EmbedfleetError, InternalError, echo
from embedfleet.common.protocol.records import Answer, Kind, Outcome, Taken
from embedfleet.common.request import EmbedRequest
from embedfleet.common.result import Result
from embedfleet.worker.engine.seam import Prepared, Work
from embedfleet.worker.serving import answers
from embedfleet.worker.serving.jobdata import decode_job

if TYPE_CHECKING:
    from embedfleet.worker.serving.cache import Lookup

log = logging.getLogger("embedfleet.worker")


@dataclass
class Stamps:
    """When a round passed each step, in nanoseconds since the epoch (time.time_ns): what its requests' spans
    are made of when tracing is on (worker/serving/traces.py); 0: not reached. A few clock reads per round."""

    take: int = 0  # the take began (a blocking take: its wait included)
    taken: int = 0  # the take returned
    tokenise: int = 0  # the engine's prepare began (verify, tokenise; the cache's lookup after it)
    prepared: int = 0  # the round is ready for the device
    forward: int = 0  # its forward passes began
    forwarded: int = 0  # and ended (0: the round never reached the device)
    finish: int = 0  # the finish stage took it up
    answered: int = 0  # its answers are ready (cut, normalise, cast; long requests spread, parts joined)
    published: int = 0  # the store-and-acknowledge script returned


@dataclass
class Round:
    """One round of taken jobs: the engine's Work for the runnable ones, answers for the rest; what only the
    serving side knows of that work (worker/serving/steps.py) beside it."""

    began: float
    runnable: list[Taken] = field(default_factory=list)
    answers: list[Answer] = field(default_factory=list)  # decided before the engine (bad data, cancels)
    work: Work | None = None
    spread: dict[int, Prepared] = field(default_factory=dict)  # long requests set aside for the fleet (spread.py)
    lookup: Lookup | None = None  # the cache's keys and hits for the work's inputs (cache.py); None: no cache
    reply_to: dict[str, str | None] = field(default_factory=dict)
    engine_error: BaseException | None = None
    # lower-level work only: pauses between its forward passes for higher-level work (worker/serving/levels.py)
    lower: bool = False
    preemptible: bool = False  # lower and not the share's round: given back if higher-level work beats it
    passes: int | None = None  # forward passes its work needs, about (`passes_of`); None: not known
    largest: int | None = None  # forward passes its largest request needs alone, about (`passes_of`)
    stamps: Stamps = field(default_factory=Stamps)

    @property
    def size(self) -> int:
        return len(self.runnable) + len(self.answers)

    def run(self, job: Taken, request: EmbedRequest) -> None:
        self.runnable.append(job)
        self.reply_to[job.id] = request.reply_to

    def requests(self) -> dict[str, EmbedRequest]:
        """The runnable jobs' requests, by job id."""
        return {job.id: request for job, request in zip(self.runnable, self.work.requests)} if self.work else {}

    def spreads(self) -> list[tuple[Taken, EmbedRequest, object]]:
        """(job, verified request, prepared inputs) of each long request the engine left to spread."""
        if self.work is None:
            return []
        return [(self.runnable[i], self.work.verified(i), prepared) for i, prepared in self.spread.items()]


def passes_of(round_: Round, shape) -> tuple[int | None, int | None]:
    """About how many forward passes the round's work needs at `shape` (a worker.engine.shaper.Shape), and its
    largest request alone: the inputs it must compute (not the cached ones) sorted by length and cut as the
    engine cuts them; (None, None) without a shape."""
    if shape is None:
        return None, None
    work = round_.work
    if work is None:
        return 0, 0
    return work.passes_needed(shape, round_.lookup.hits if round_.lookup is not None else {})


def triage(round_: Round, taken: list[Taken], model: str, max_deliveries: int, now: float,
           waited=None) -> list[EmbedRequest]:
    """Answer each taken job that cannot run; the requests of the runnable ones (in `round_.runnable`'s
    order). `waited(queue, seconds)`: told how long each runnable request waited in its queue."""
    requests: list[EmbedRequest] = []
    for job in taken:
        if job.kind is Kind.STARTED and job.lapses >= max_deliveries:
            round_.answers.append(answers.poisoned(job, model, max_deliveries))
            log.error("request %s: %s", job.id, round_.answers[-1].reason)
        elif job.kind is Kind.STARTED:
            try:
                request = decode_job(job.id, job.data, model)
            except EmbedfleetError as exc:
                round_.answers.append(answers.failed(job, exc, Outcome.FAILED, None, model))
                continue
            if waited is not None:
                waited(job.queue, now - request.created_at)
            if request.expired(now):  # its deadline passed while queued: never computed
                round_.answers.append(answers.expired(job, request, now))
                continue
            round_.run(job, request)
            requests.append(request)
        elif job.kind is Kind.BAD:  # its job hash was changed by hand: failed with the reason, never run
            round_.answers.append(answers.corrupt(job, model))
            log.error("request %s: %s", job.id, job.reason)
        elif job.kind is Kind.CANCELED:
            round_.answers.append(answers.cancelled(job, model))
        else:  # nothing to answer: no job hash, an id no job can have, or a job already ended
            log.warning("dropped queue entry %r (%s)", echo(job.id), job.kind.value)
    return requests


def results(round_: Round, finish, model: str) -> list[Result | None]:
    """One result per runnable job (None: a long request spread over the fleet, answered by its parts):
    `finish(round_)`'s (worker/serving/steps.py), or, where the engine failed the round, its error."""
    if round_.work is None:
        return []
    if round_.engine_error is None:
        try:
            found = finish(round_)
            if len(found) == len(round_.runnable):
                return found
            round_.engine_error = InternalError(f"engine returned {len(found)} results for "
                                                f"{len(round_.runnable)} requests")
        except Exception as exc:  # the round's requests get this error (retried by rq), never no answer
            log.exception("finishing a round of %d failed", round_.size)
            round_.engine_error = exc
    error = round_.engine_error
    if not isinstance(error, EmbedfleetError):
        error = InternalError(f"engine failed: {type(error).__name__}: {error}")
    return [Result.failure(job.id, model, error) for job in round_.runnable]


def answers_of(round_: Round, found: list[Result | None], model: str) -> list[Answer]:
    """Every job's answer: those decided before the engine, then each runnable job's from its result."""
    return list(round_.answers) + [answers.served(job, result, round_.reply_to.get(job.id), model)
                                   for job, result in zip(round_.runnable, found)]
