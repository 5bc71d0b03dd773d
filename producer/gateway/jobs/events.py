"""GET /v1/jobs/events?ids=a,b,c: each job's result as a Server-Sent Event the moment it lands.

Every event is `event: job`, `id: <job id>`, and `data:` the job's JSON (producer.gateway.jobs.results):
the /v1/jobs/{id} body with `status: finished`, or the job's error with its status. Each id gets exactly
one event; an id with no job gets one with status `not_found`. When every id has had its event, a final
`event: done` ends the stream. After ?timeout= seconds (at most the gateway's max_wait) the ids still
pending get one event each with their status (`queued`, `started`) and the stream ends: reconnect with
those. A comment line every KEEPALIVE seconds keeps proxies from closing an idle stream.

Jobs live in Redis and waits go through the gateway's AsyncProducer, so any replica serves any job's
events, whichever replica accepted it. With API keys, another key's job gets the event of an id with no
job, at once, and is never waited for (producer/gateway/core/owners.py).
"""

from __future__ import annotations

import asyncio
import json
import time

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import StreamingResponse

from embedfleet.common.errors import EmbedfleetError, NotFoundError, ResultTimeoutError, ValidationError
from embedfleet.common.names import MAX_REQUEST_ID_LENGTH, valid_request_id
from embedfleet.producer.gateway.core.auth import require_key
from embedfleet.producer.gateway.jobs.results import job_body, unsettled_body
from embedfleet.producer.gateway.core.owners import no_such_job, owner_of
from embedfleet.producer.gateway.core.service import Gateway, gateway

router = APIRouter(dependencies=[Depends(require_key)])
KEEPALIVE = 15.0  # seconds between comment lines on a quiet stream


def parse_ids(ids: str, limit: int) -> list[str]:
    """The comma-separated job ids, each once, in the order given; ValidationError for anything else."""
    wanted = list(dict.fromkeys(i.strip() for i in ids.split(",") if i.strip()))
    if not wanted:
        raise ValidationError("`ids` must name at least one job id (comma-separated)", param="ids")
    if len(wanted) > limit:
        raise ValidationError(f"`ids` names {len(wanted)} jobs; one stream follows at most {limit} (open "
                              "several)", param="ids")
    bad = next((i for i in wanted if not valid_request_id(i)), None)
    if bad is not None:
        raise ValidationError(f"`ids`: {bad[:80]!r} is no job id: a job id is 1 to {MAX_REQUEST_ID_LENGTH} "
                              "letters, digits, '_' or '-'", param="ids")
    return wanted


def event(name: str, data: dict, event_id: str | None = None) -> bytes:
    head = f"event: {name}\n" + (f"id: {event_id}\n" if event_id else "")
    return (head + "data: " + json.dumps(data, separators=(",", ":")) + "\n\n").encode()


@router.get("/v1/jobs/events")
async def job_events(request: Request, ids: str = Query(..., description="comma-separated job ids"),
                     timeout: float | None = Query(None, gt=0, description="seconds to follow the jobs "
                                                                           "(capped by the gateway's max_wait)"),
                     gw: Gateway = Depends(gateway)) -> StreamingResponse:
    wanted = parse_ids(ids, gw.settings.max_event_ids)
    seconds = min(timeout or gw.settings.max_wait, gw.settings.max_wait)
    # Read once, before the headers: whose each job is, and how to answer it when it lands.
    visible = await gw.visible_jobs(wanted, owner_of(request))
    return StreamingResponse(_stream(gw, wanted, visible, seconds), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def _stream(gw: Gateway, wanted: list[str], visible: dict[str, dict], seconds: float):
    deadline = time.monotonic() + seconds
    for job_id in wanted:
        if job_id not in visible:  # another key's job, or no job at all: the same event either way
            yield event("job", _not_found(job_id), job_id)
    waits = {asyncio.ensure_future(gw.producer.wait(job_id, seconds)): job_id for job_id in visible}
    try:
        pending = set(waits)
        while pending:
            left = deadline - time.monotonic()
            done, pending = await asyncio.wait(pending, timeout=min(max(left, 0), KEEPALIVE),
                                               return_when=asyncio.FIRST_COMPLETED)
            if not done:
                if time.monotonic() >= deadline:
                    break
                yield b": keep-alive\n\n"
            for task in done:
                job_id = waits[task]
                yield event("job", await _reported(_settled(gw, job_id, task, visible[job_id]), job_id), job_id)
        for task in pending:  # the deadline passed: say where each still stands
            task.cancel()
            job_id = waits[task]
            yield event("job", await _reported(_status(gw, job_id), job_id), job_id)
        yield event("done", {"ids": len(wanted)})
    finally:
        for task in waits:
            task.cancel()


async def _reported(body, job_id: str) -> dict:
    """`body`, or the error that kept it from being read (Redis gone mid-stream): the headers are sent,
    so an error is an event like any other."""
    try:
        return await body
    except EmbedfleetError as err:
        return unsettled_body(job_id, "unknown", err)


async def _status(gw: Gateway, job_id: str) -> dict:
    return unsettled_body(job_id, await gw.producer.status(job_id))


def _not_found(job_id: str) -> dict:
    return unsettled_body(job_id, "not_found", no_such_job(job_id))


async def _settled(gw: Gateway, job_id: str, task: asyncio.Task, options: dict) -> dict:
    """The event of a wait that ended: the result, the job's own error, or why there is none."""
    try:
        result = task.result()
    except NotFoundError:
        return _not_found(job_id)
    except ResultTimeoutError:
        return unsettled_body(job_id, await gw.producer.status(job_id))
    except EmbedfleetError:  # the job's own error: its stored result says which, with its status
        result = await gw.producer.get(job_id)
        if result is None:
            raise
    return job_body(result, options)
