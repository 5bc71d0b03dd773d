"""The finish stage: each round's answers (cut, normalise, cast: the engine's last step; the request's own error;
the decisions made before the engine), long requests spread and parts joined (worker/serving/spread.py), then
one script that stores and acknowledges them all (worker/serving/storing.py), and the jobs are no longer held.

Status decisions, per job:
- answered by the engine (embeddings, or the request's own error such as a validation error): FINISHED;
- the engine's internal_error (a forward pass failed even alone, a crash in pre/postprocessing): requeued
  while rq's Retry lasts (the fault may be the machine's, e.g. CUDA out of memory), then FAILED;
- undecodable job data, or a request for another model: FAILED at once with the reason, never retried;
- cancelled while queued: CANCELED, answered `cancelled` unless it has an answer;
- taken again after its workers died with it MAX_DELIVERIES times: FAILED `poison`, never run;
- a long request spread over the fleet: FINISHED without an answer once its parts are queued; a part: answered
  into its request's join, never under its own id, FAILED rather than retried (worker/serving/spread.py).
"""

from __future__ import annotations

import logging
import time

from embedfleet.worker.engine import stageclock
from embedfleet.worker.serving import rounds
from embedfleet.worker.serving.handoff import END, Handoff
from embedfleet.worker.serving.ledger import Ledger
from embedfleet.worker.serving.livestats import LiveStats
from embedfleet.worker.serving.rounds import Round
from embedfleet.worker.serving.spread import ChunkJobs
from embedfleet.worker.serving.steps import Steps
from embedfleet.worker.serving.storing import Store

log = logging.getLogger("embedfleet.worker")
rounds_log = logging.getLogger("embedfleet.worker.rounds")  # a line per round (off: `worker --no-log-rounds`)


class FinishStage:
    """Answers, stores and acknowledges one worker's rounds; `loop` runs on its own thread. `batches` and
    `served` count the rounds stored and the jobs finished (written by this stage alone)."""

    def __init__(self, name: str, steps: Steps, store: Store, chunk_jobs: ChunkJobs, *, ledger: Ledger,
                 live: LiveStats, metrics=None, traces=None):
        self.name = name
        self.steps = steps
        self.model = steps.engine.caps.name
        self.store = store
        self.chunk_jobs = chunk_jobs
        self.ledger = ledger
        self.live = live
        self.metrics = metrics
        self.traces = traces  # worker/serving/traces.py's RoundTraces when tracing is on, else None
        self.batches = 0
        self.served = 0

    def loop(self, handoff: Handoff) -> None:
        while True:
            stageclock.lap("other")
            round_ = handoff.next_finished()
            stageclock.lap("wait: for a round")
            if round_ is END:
                break
            try:
                self.finish_round(round_)
            except Exception:  # its jobs stay started and are recovered by their leases
                log.exception("worker %s: could not store a round of %d; its jobs will be recovered",
                              self.name, round_.size)
                self.release(round_)

    def finish_round(self, round_: Round) -> None:
        """Answers for every job of the round, then the script that stores and acknowledges them (one call, or
        a few for a round of large results: worker/serving/storing.py)."""
        stageclock.lap("other")
        round_.stamps.finish = time.time_ns()
        # with tracing on: each request's span, open until its answer is published (a spread request's parts
        # carry it: their spans are its children)
        opened = self.traces.open(round_) if self.traces is not None else {}
        found = rounds.results(round_, self.steps.finish, self.model)
        written = rounds.answers_of(round_, found, self.model)
        written = self.chunk_jobs.settle(round_, written, self._context_of(opened))  # spread, and parts joined
        round_.stamps.answered = time.time_ns()
        stageclock.lap("answers")
        done, written = self.store.write(written, time.time() - round_.began)
        round_.stamps.published = time.time_ns()
        stageclock.lap("publish")
        if round_.engine_error is None:
            self.steps.cache_new(round_)  # after the answers: not on their way
        self.release(round_)
        if self.traces is not None:
            self.traces.close(round_, opened, written)
            stageclock.lap("traces")
        if self.metrics is not None:
            self.metrics.answered([answer.code for answer in written])
        self.batches += 1
        self.served += done.finished
        self.live.finished(sum(result.shape[0] for result in found if result is not None and result.ok))
        for request_id, problem in done.problems:
            log.warning("worker %s: request %s: %s", self.name, request_id, problem)
        if not round_.size:  # it went back to its queue before the device (logged there)
            return
        rounds_log.info("worker %s: round of %d: %d served, %d failed, %d requeued%s in %.3f s", self.name,
                        round_.size, done.finished, done.failed, done.requeued,
                        f", {done.late} answered late (their claim had lapsed)" if done.late else "",
                        time.time() - round_.began)

    def _context_of(self, opened: dict):
        """job id -> (traceparent, tracestate) its spread parts carry; None without tracing."""
        if self.traces is None:
            return None
        return lambda job_id: self.traces.carried(opened, job_id)

    def release(self, round_: Round) -> None:
        """The round's jobs are held no more (answered, or left to their leases); in-flight markers after the
        answers: followers see a result, or run on their own."""
        self.ledger.release([answer.taken for answer in round_.answers], round_.runnable)
