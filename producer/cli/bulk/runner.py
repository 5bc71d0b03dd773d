"""The bulk run: submit units within a bounded window, log each result to the checkpoint, then write OUTPUT.

At most `window` requests of the run are in the fleet's queue at any time (also across a restart: requests
a killed run left in flight are waited for, not submitted again). Ctrl-C cancels the run's queued requests
and keeps the checkpoint; the next run with the same input and flags skips what is done.
"""

from __future__ import annotations

import contextlib
import inspect
import re
import signal
import sys
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from common.errors import (CancelledError, EmbedfleetError, NotFoundError, UnknownModelError, ValidationError,
                           error_from_code)
from common.params import PoolingParams
from common.result import Result
from producer.cli.bulk import sinks
from producer.cli.bulk.checkpoint import Checkpoint, checkpoint_path, fingerprint
from producer.cli.bulk.progress import Progress
from producer.cli.bulk.sources import Source, Unit
from producer.client.blocking import Producer
from producer.client.core import pick_model

_INPUT_INDEX = re.compile(r"^input (\d+) ")
REQUEST_ERRORS = (ValidationError, UnknownModelError)  # the request's own fault: redoing it cannot help


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
        producer.check()
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
            failures = window.run()
        except KeyboardInterrupt:
            window.cancel_queued()
            checkpoint.close()
            print(f"interrupted: {len(state.done)} of {len(source.units)} requests done, kept in "
                  f"{checkpoint.path}; rerun the same command to resume", file=sys.stderr)
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

    def run(self) -> list[str]:
        done_texts = sum(len(self.units[i].inputs) for i in self.checkpoint.state.done)
        with Progress(self.plan.source.texts, done_texts, self.plan.progress) as progress:
            while self.todo or self.inflight:
                for unit in self._fill():
                    progress.advance(len(self.units[unit].inputs))
                progress.in_flight(self._texts_in_flight())
                if not self.inflight:
                    continue
                for unit in self._collect():
                    progress.advance(len(self.units[unit].inputs))
                progress.in_flight(self._texts_in_flight())  # the last results leave none in flight
        return self.failures

    def _texts_in_flight(self) -> int:
        return sum(len(self.units[unit].inputs) for unit in self.inflight)

    def _collect(self) -> list[int]:
        """Settle every in-flight request whose result has landed (one MGET), else wait for the oldest."""
        flying = list(self.inflight.items())
        landed = [(unit, request_id, result) for (unit, request_id), result
                  in zip(flying, self.producer.get_many([request_id for _, request_id in flying]))
                  if result is not None]
        for unit, request_id, result in landed:
            self._settle(unit, request_id, lambda result=result: (result.raise_for_error(), result)[1])
        if landed:
            return [unit for unit, _, _ in landed]
        unit, request_id = flying[0]
        self._settle(unit, request_id, lambda: self.producer.wait(request_id, self.plan.timeout))
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
        # Ctrl-C waits until the ids are in the checkpoint: a restart then waits for them, never submitting
        # a second copy beside them (which would hold more than the window in the queue).
        with _no_interrupt():
            try:
                ids = self.producer.submit_many([self.units[i].inputs for i in indices], model,
                                                **fields, **self.priority)
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

    def cancel_queued(self) -> None:
        """Ctrl-C: what no worker took yet is cancelled (a restart resubmits it); the rest finishes."""
        for request_id in self.inflight.values():
            with contextlib.suppress(EmbedfleetError):
                self.producer.cancel(request_id)


@contextlib.contextmanager
def _no_interrupt():
    """SIGINT held back (delivered on exit) during a step that must not be cut in half."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


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
