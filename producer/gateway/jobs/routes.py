"""Durable async jobs for web apps that should not hold a connection open while a worker computes.

POST /v1/jobs -> 202 {id, status} (with `webhook`: the result is POSTed there, see
producer/gateway/jobs/webhooks.py; GET /v1/jobs/events streams results as they land, see
producer/gateway/jobs/events.py); GET /v1/jobs/{id}[?wait=S] -> 202 while queued/started, 200 with the
/v1/embeddings body (plus `status`) once finished, or the job's own error in OpenAI's shape and status;
DELETE /v1/jobs/{id} cancels a job no worker has taken yet. Jobs live in Redis, so any gateway replica
answers for any job, and a gateway restart loses none. With API keys, a job is its creating key's alone:
to any other key it does not exist (producer/gateway/core/owners.py).
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, Response

from embedfleet.common.names import MAX_REQUEST_ID_LENGTH, valid_request_id
from embedfleet.common.protocol import keys
from embedfleet.common.redisclient import is_cluster
from embedfleet.common.errors import EmbedfleetError, InternalError, NotFoundError, UnavailableError, ValidationError
from embedfleet.producer.gateway.core import encoding
from embedfleet.producer.gateway.core.auth import admit, require_key
from embedfleet.producer.gateway.core.errors import JobNotCancellableError
from embedfleet.producer.gateway.core.owners import no_such_job, owner_of
from embedfleet.producer.client.redisfaults import redis_errors
from embedfleet.producer.gateway.jobs.schemas import JobBody
from embedfleet.producer.gateway.core.service import Gateway, gateway

router = APIRouter(dependencies=[Depends(require_key)])
PENDING = ("queued", "started")


def _known_shape(job_id: str) -> str:
    """`job_id` if it can name a job; anything else (`*`, `%00`, a space, ...) is no job of ours: a 404."""
    if not valid_request_id(job_id):
        raise NotFoundError(f"no such job: a job id is 1 to {MAX_REQUEST_ID_LENGTH} letters, digits, "
                            "'_' or '-'", param="id")
    return job_id


def _job(job_id: str, status: str, code: int = 202) -> JSONResponse:
    return JSONResponse({"id": job_id, "object": "job", "status": status}, status_code=code)


@router.post("/v1/jobs", status_code=202, dependencies=[Depends(admit)])
async def create_job(body: JobBody, request: Request, gw: Gateway = Depends(gateway)) -> JSONResponse:
    body.dense_only("/v1/jobs")
    if body.webhook and not gw.settings.webhook_secret:
        raise ValidationError("this gateway signs webhooks and has no --webhook-secret (EMBEDFLEET_WEBHOOK_"
                              "SECRET): `webhook` is refused; poll GET /v1/jobs/{id} or follow GET "
                              "/v1/jobs/events instead", param="webhook")
    if body.webhook:  # before the enqueue: a refused URL leaves no job behind
        await gw.settings.webhook_policy.check_at_submit(body.webhook, gw.settings.webhook_timeout)
    # On a Redis Cluster the shared webhook stream lies in another slot than the job: its webhook is found by
    # the sweeps alone there (producer/gateway/jobs/webhooks.py, `woken`)
    clustered = is_cluster(gw.producer.shards.url_for(body.model))
    job_id = await gw.submit(body, reply_to=keys.WEBHOOK_STREAM if body.webhook and not clustered else None)
    await gw.save_job_options(job_id, body, owner_of(request))
    if body.webhook:  # the durable delivery list: any replica delivers (producer/gateway/jobs/webhooks.py)
        with redis_errors():
            await gw.deliveries[await gw.producer.url_of(job_id)].register(job_id)
    response = _job(job_id, "queued")
    response.headers["Location"] = f"/v1/jobs/{job_id}"
    return response


@router.get("/v1/jobs/{job_id}")
async def get_job(job_id: str, request: Request, gw: Gateway = Depends(gateway),
                  wait: float = Query(0.0, ge=0, description="seconds to long-poll for the result "
                                                              "(capped by the gateway's max_wait)")
                  ) -> Response:
    job_id = _known_shape(job_id)
    # Whose job it is, first: another key's job is not waited for, and its options (read once, here)
    # cannot change hands while a long-poll waits.
    options = await gw.visible_job(job_id, owner_of(request))
    result = await gw.producer.get(job_id)
    if result is None:
        status = await gw.producer.status(job_id)
        if status == "not_found":
            raise no_such_job(job_id)
        if status in PENDING and wait > 0:
            try:  # BLPOP on the job's notify list: returns the moment the result lands
                await gw.producer.wait(job_id, min(wait, gw.settings.max_wait))
            except UnavailableError:
                raise
            except EmbedfleetError:
                pass  # a timeout, or the job's own error: the result (if any) is read below
            result = await gw.producer.get(job_id)
        if result is None:
            status = await gw.producer.status(job_id)
            if status in PENDING:
                return _job(job_id, status)
            result = await gw.producer.get(job_id)  # it landed between the two reads
            if result is None and status == "not_found":  # its job vanished while we waited
                raise no_such_job(job_id)
            if result is None:
                raise InternalError(f"job {job_id} is {status} but left no result")
    result.raise_for_error()
    return encoding.embeddings_response(result, options["encoding_format"], options["explicit_layout"],
                                        extra={"status": "finished"})


@router.delete("/v1/jobs/{job_id}")
async def cancel_job(job_id: str, request: Request, gw: Gateway = Depends(gateway)) -> JSONResponse:
    job_id = _known_shape(job_id)
    await gw.visible_job(job_id, owner_of(request))
    status = await gw.producer.status(job_id)
    if status == "not_found":
        raise no_such_job(job_id)
    if status == "queued" and await gw.producer.cancel(job_id):
        return _job(job_id, "cancelled", code=200)
    if status == "queued":  # a worker took it between the two reads (rq says "started" a moment later)
        status = "taken by a worker"
    raise JobNotCancellableError(f"job {job_id} is {status}: only a queued job can be cancelled")
