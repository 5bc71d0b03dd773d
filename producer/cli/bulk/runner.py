"""The bulk run: submit units within a bounded window, log each result to the checkpoint, then write OUTPUT.

At most `window` requests of the run are in the fleet's queue at any time (also across a restart: requests
a killed run left in flight are waited for, not submitted again). Ctrl-C cancels the run's queued requests
and keeps the checkpoint; the next run with the same input and flags skips what is done. Ctrl-C is acted on
between steps, each bounded (CtrlC says why), within about WAIT_SLICE + CANCEL_SECONDS; a second one ends
the process at once.
"""

from __future__ import annotations

import contextlib
import inspect
import re
import signal
import sys
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from embedfleet.common.errors import (CancelledError, EmbedfleetError, NotFoundError, ResultTimeoutError,
                                      UnknownModelError, ValidationError, error_from_code)
from embedfleet.common.params import PoolingParams
from embedfleet.common.result import Result
from embedfleet.producer.cli.bulk import sinks
from embedfleet.producer.cli.bulk.checkpoint import Checkpoint, checkpoint_path, fingerprint
from embedfleet.producer.cli.bulk.progress import Progress
from embedfleet.producer.cli.bulk.sources import Source, Unit
from embedfleet.producer.cli.ctrlc import CtrlC
from embedfleet.producer.client.blocking import Producer
from embedfleet.producer.client.core import pick_model

_INPUT_INDEX = re.compile(r"^input (\d+) ")
REQUEST_ERRORS = (ValidationError, UnknownModelError)  # the request's own fault: redoing it cannot help
WAIT_SLICE = 0.5  # seconds a wait for a result blocks before the run looks whether Ctrl-C was pressed
CANCEL_SECONDS = 2.0  # the most Ctrl-C spends cancelling the run's queued requests (a rerun waits for the rest)


@dataclass(frozen=True)
class Plan:
    source_path: Path
    target: Path
    source: Source
    model: str | None
    fields: dict
    window: int
    timeout: float
    priority: str | None
    resume: bool
    progress: bool
    settings: dict  # what changes the output, for the checkpoint's fingerprint


def priority_field(producer: Producer) -> bool:
    """True if this build's Producer takes a request `priority` (issue #10 adds it beside this tool): as a
    keyword of submit_many or a PoolingParams field. Without it every request goes on the one queue."""
    return "priority" in inspect.signature(producer.submit_many).parameters or \
        "priority" in PoolingParams.model_fields


def run(plan: Plan) -> int:
    source = plan.source
    with Producer(plan.settings["redis_url"], shards=plan.settings["shards"]) as producer:
        for down in producer.check():  # a partition whose model has others: the run goes on with them
            print(f"embedfleet: {str(down).rstrip('.')}; its requests go to the other partitions", file=sys.stderr)
        model = plan.model if source.is_batch else \
            pick_model(plan.model, producer.models(), where=producer.where).name
        priority = {"priority": plan.priority} if plan.priority and priority_field(producer) else {}
        manifest = fingerprint(plan.source_path, {k: v for k, v in plan.settings.items()
                                                  if k not in ("redis_url", "shards")} | {"model": model})
        checkpoint = Checkpoint(checkpoint_path(plan.target), manifest)
        state = checkpoint.open(plan.resume)
        if state.done or state.submitted:
            print(f"resuming from {checkpoint.path}: {len(state.done)} of {len(source.units)} requests done, "
                  f"{len(state.submitted)} in flight", file=sys.stderr)
        window = Window(producer, checkpoint, plan, model, priority)
        try:
            with CtrlC() as ctrl_c:
                failures = window.run(ctrl_c)
        except KeyboardInterrupt:
            signal.signal(signal.SIGINT, signal.SIG_DFL)  # (CtrlC did, unless it came before CtrlC was in place)
            print(f"interrupted: {len(state.done)} of {len(source.units)} requests done, kept in "
                  f"{checkpoint.path}; rerun the same command to resume", file=sys.stderr, flush=True)
            left = window.cancel_queued()
            checkpoint.close()
            if left:
                print(f"{left} requests of the run were not cancelled within {CANCEL_SECONDS:g} s and stay "
                      "queued; the rerun waits for them", file=sys.stderr)
            raise
        except REQUEST_ERRORS:  # the flags: the same command would fail the same way
            checkpoint.close()
            raise
        except EmbedfleetError as exc:  # the fleet's trouble, not the file's: what is done is kept
            checkpoint.close()
            raise error_from_code(exc.code, f"{exc.message.rstrip('.')}; {len(state.done)} of "
                                  f"{len(source.units)} requests done are kept in {checkpoint.path}: rerun "
                                  "the same command to resume", exc.param) from exc
        except BaseException:
            checkpoint.close()
            raise
    if failures:
        checkpoint.discard()  # the lines (or flags) must change, and with them the run: nothing to resume
        raise ValidationError(_failure_summary(failures, plan.target))
    return _write(plan, checkpoint)


def _write(plan: Plan, checkpoint: Checkpoint) -> int:
    source, tokens = plan.source, 0

    def counted():
        nonlocal tokens
        for _, result in checkpoint.results():
            tokens += result.usage.prompt_tokens
            yield result

    if source.is_batch:
        failed = sinks.write_batch(plan.target, ((u.custom_id, u.encoding_format, r)
                                                 for u, r in zip(source.units, counted())))
        checkpoint.discard()
        print(f"answered {len(source.units)} batch requests ({failed} failed, {tokens} tokens) -> {plan.target}")
        return 0
    if plan.fields.get("task") == "sparse_embed":
        rows = sinks.write_sparse(plan.target, source.ids, counted())
        checkpoint.discard()
        print(f"embedded {rows} texts as sparse vectors ({tokens} tokens) -> {plan.target}")
        return 0
    shape, dtype = sinks.write_texts(plan.target, source.ids, counted(), source.texts)
    checkpoint.discard()
    print(f"embedded {source.texts} texts ({tokens} tokens) -> {plan.target} {shape} {dtype}")
    return 0


class Window:
    """The submit/collect loop: keeps `window` requests in flight, oldest collected first."""

    def __init__(self, producer: Producer, checkpoint: Checkpoint, plan: Plan, model: str | None, priority: dict):
        self.producer, self.checkpoint, self.plan = producer, checkpoint, plan
        self.model, self.priority = model, priority
        self.units = plan.source.units
        state = checkpoint.state
        self.inflight: OrderedDict[int, str] = OrderedDict(sorted(state.submitted.items()))
        self.adopted = set(self.inflight)  # left in flight by a killed run: may have expired or been cancelled
        self.todo = [u.index for u in self.units if u.index not in state.done and u.index not in self.inflight]
        self.failures: list[str] = []
        self.waiting: dict[int, float] = {}  # unit -> when the run began to wait for its result

    def run(self, ctrl_c: CtrlC) -> list[str]:
        """The failing lines of a text input (all others done); KeyboardInterrupt once Ctrl-C was pressed."""
        done_texts = sum(len(self.units[i].inputs) for i in self.checkpoint.state.done)
        with Progress(self.plan.source.texts, done_texts, self.plan.progress) as progress:
            while (self.todo or self.inflight) and not ctrl_c.pressed:
                for unit in self._fill():
                    progress.advance(len(self.units[unit].inputs))
                progress.in_flight(self._texts_in_flight())
                if not self.inflight:
                    continue
                for unit in self._collect():
                    progress.advance(len(self.units[unit].inputs))
                progress.in_flight(self._texts_in_flight())  # the last results leave none in flight
        if ctrl_c.pressed:  # seen between steps: every id submitted is in the checkpoint
            raise KeyboardInterrupt
        return self.failures

    def _texts_in_flight(self) -> int:
        return sum(len(self.units[unit].inputs) for unit in self.inflight)

    def _collect(self) -> list[int]:
        """Settle every in-flight request whose result has landed (one MGET), else wait for the oldest (for one
        WAIT_SLICE: [] if it has not landed by then)."""
        flying = list(self.inflight.items())
        landed = [(unit, request_id, result) for (unit, request_id), result
                  in zip(flying, self.producer.get_many([request_id for _, request_id in flying]))
                  if result is not None]
        for unit, request_id, result in landed:
            self._settle(unit, request_id, lambda result=result: (result.raise_for_error(), result)[1])
        if landed:
            return [unit for unit, _, _ in landed]
        unit, request_id = flying[0]
        # a slice at a time, so that Ctrl-C is seen between them; --timeout counts over all of them
        left = self.waiting.setdefault(unit, time.monotonic()) + self.plan.timeout - time.monotonic()
        try:
            self._settle(unit, request_id, lambda: self.producer.wait(request_id, max(min(WAIT_SLICE, left), 0.01)))
        except ResultTimeoutError:
            if left > WAIT_SLICE:
                return []
            raise ResultTimeoutError(f"no result for request {request_id} after {self.plan.timeout:g} s (status: "
                                     f"{self.producer.status(request_id)})") from None
        self.waiting.pop(unit, None)
        return [unit]

    def _fill(self) -> list[int]:
        """Submit up to the window; returns the batch lines answered without a request (refused ones)."""
        # Refilled a quarter of the window at a time: each submit is a few round trips (a WATCH
        # transaction) whatever its size, and the queue still holds 3/4 of the window meanwhile.
        free = self.plan.window - len(self.inflight)
        if free < min(max(1, self.plan.window // 4), len(self.todo)) or not self.todo:
            return []
        batch, self.todo = self.todo[:free], self.todo[free:]
        answered = [i for i in batch if self.units[i].error is not None]
        for index in answered:  # a batch line refused on reading: its answer is the error
            unit = self.units[index]
            self.checkpoint.done(index, Result.failure(f"line-{index}", unit.model or "", unit.error))
        batch = [i for i in batch if i not in answered]
        if not self.plan.source.is_batch:
            if batch:
                self._submit(batch, self.model, self.plan.fields)
            return answered
        groups: dict[tuple, list[int]] = {}  # batch lines with the same model and fields go in one submit
        for index in batch:
            unit = self.units[index]
            groups.setdefault((unit.model or self.model, repr(sorted(unit.fields.items()))), []).append(index)
        for (model, _), indices in groups.items():
            if self._submit(indices, model, self.units[indices[0]].fields):
                continue
            if len(indices) == 1:  # refused, and answered with its error
                answered += indices
                continue
            for index in indices:  # one line's fault fails the whole submit: each goes alone
                if not self._submit([index], model, self.units[index].fields):
                    answered.append(index)
        return answered

    def _submit(self, indices: list[int], model: str | None, fields: dict) -> bool:
        """Submit and log the ids; False if refused for the request's own fault (a batch line, alone, is
        then answered with that error)."""
        # Never cut in half by Ctrl-C (CtrlC): the ids are in the checkpoint before the run stops, and a restart
        # waits for them, never submitting a second copy beside them (more than the window in the queue).
        try:
            ids = self.producer.submit_many([self.units[i].inputs for i in indices], model, **fields, **self.priority)
        except REQUEST_ERRORS as exc:
            if not self.plan.source.is_batch:
                raise  # the flags are wrong for every chunk: say so once
            if len(indices) == 1:
                self.checkpoint.done(indices[0], Result.failure(f"line-{indices[0]}", model or "", exc))
            return False
        for index, request_id in zip(indices, ids):
            self.checkpoint.submitted(index, request_id)
            self.inflight[index] = request_id
        return True

    def _settle(self, index: int, request_id: str, outcome) -> None:
        """Log the result `outcome()` gives, or decide what its error means for the run."""
        unit = self.units[index]
        try:
            result = outcome()
        except (CancelledError, NotFoundError):
            if index not in self.adopted:
                raise
            self.adopted.discard(index)  # cancelled by the Ctrl-C that stopped the last run, or expired
            del self.inflight[index]
            self.todo.insert(0, index)
            return
        except REQUEST_ERRORS as exc:
            del self.inflight[index]
            if self.plan.source.is_batch:
                self.checkpoint.done(index, Result.failure(request_id, unit.model or self.model or "", exc))
            else:
                self.failures.append(_locate(exc, unit))
            return
        del self.inflight[index]
        self.checkpoint.done(index, result)

    def cancel_queued(self) -> int:
        """Ctrl-C: what no worker took yet is cancelled (a restart resubmits it); the rest finishes. A request
        or two round trips each (the Producer cancels one id at a time), for at most CANCEL_SECONDS: a request
        not cancelled then stays in flight in the checkpoint, and a rerun waits for it, as after a kill. Returns
        how many were left so."""
        deadline = time.monotonic() + CANCEL_SECONDS
        flying = list(self.inflight.values())
        for done, request_id in enumerate(flying):
            if time.monotonic() > deadline:
                return len(flying) - done
            with contextlib.suppress(EmbedfleetError):
                self.producer.cancel(request_id)
        return 0


def _locate(err: EmbedfleetError, unit: Unit) -> str:
    """The error of one request as `FILE:LINE: what`, the line found from the worker's "input N"."""
    found = _INPUT_INDEX.match(err.message)
    if found and int(found.group(1)) < len(unit.where):
        what = err.message[found.end():].split(": shorten it")[0]
        return f"{unit.where[int(found.group(1))]} {what}"
    return f"{unit.where[0]} to {unit.where[-1].rsplit(':', 1)[-1]}: {err.message}"


def _failure_summary(failed: list[str], target: Path) -> str:
    more = f" (and {len(failed) - 3} more)" if len(failed) > 3 else ""
    too_long = any("tokens, more than" in f for f in failed)
    hint = "pass --truncate-prompt-tokens -1 to cut long texts to the model's maximum" if too_long \
        else "fix those lines"
    return f"{'; '.join(failed[:3])}{more}; {target} not written; {hint}"
