"""OpenAI's /v1/files and /v1/batches routes (the `openai` client's files.* and batches.* calls).

With API keys, files and batches belong to the key that created them (its fingerprint, as jobs do:
producer/gateway/core/owners.py): another key's file or batch is answered exactly as one that does not exist.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Annotated, Literal

import redis
from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from embedfleet.common.errors import NotFoundError, ValidationError, echo
from embedfleet.common.protocol import batchkeys
from embedfleet.producer.client import traced
from embedfleet.producer.client.redisfaults import redis_errors
from embedfleet.producer.gateway.core.auth import require_key
from embedfleet.producer.gateway.batches import objects
from embedfleet.producer.gateway.batches.lines import ENDPOINT
from embedfleet.producer.gateway.batches.runner import Runner
from embedfleet.producer.gateway.batches.store import BatchGone, Store, now
from embedfleet.producer.gateway.batches.upload import UploadReader
from embedfleet.producer.gateway.core.errors import JobNotCancellableError, RateLimitedError
from embedfleet.producer.gateway.core.owners import may_see, owner_of
from embedfleet.producer.gateway.core.service import Gateway, gateway

log = logging.getLogger(__name__)
router = APIRouter(dependencies=[Depends(require_key)])

PURPOSE = "batch"  # the only purpose this gateway keeps files for
WINDOW = "24h"  # the only completion_window OpenAI offers
FILES_PATH = "/v1/files"


class ExpiresAfter(BaseModel):
    model_config = ConfigDict(extra="forbid")

    anchor: Literal["created_at"]
    seconds: int = Field(ge=batchkeys.FILE_TTL_MIN, le=batchkeys.FILE_TTL_MAX)


class BatchBody(BaseModel):
    """POST /v1/batches: OpenAI's BatchCreateParams."""

    model_config = ConfigDict(extra="forbid")

    input_file_id: str = Field(max_length=64)
    endpoint: str
    completion_window: str
    metadata: dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]] | None = Field(
        None, max_length=16, description="up to 16 key-value pairs (keys up to 64 characters, values up to 512)")
    output_expires_after: ExpiresAfter | None = None


def _store(request: Request) -> Store:
    return request.app.state.batch_store


def _runner(request: Request) -> Runner:
    return request.app.state.batch_runner


def _visible(found: dict | None, request: Request, gw: Gateway) -> bool:
    return found is not None and may_see(found, owner_of(request), bool(gw.settings.keys))


def _no_file(file_id: str) -> NotFoundError:
    return NotFoundError(f"no file with id {echo(file_id)} (never uploaded, deleted, or expired)", param="file_id")


def _no_batch(batch_id: str) -> NotFoundError:
    return NotFoundError(f"no batch with id {echo(batch_id)} (never created, or expired)", param="batch_id")


# -- files ---------------------------------------------------------------------------------------------

@router.post(FILES_PATH, openapi_extra={"requestBody": {"content": {"multipart/form-data": {"schema": {
    "type": "object", "required": ["file", "purpose"],
    "properties": {"file": {"type": "string", "format": "binary"}, "purpose": {"type": "string"},
                   "expires_after[anchor]": {"type": "string"}, "expires_after[seconds]": {"type": "integer"}}}}}}})
async def create_file(request: Request, gw: Gateway = Depends(gateway)) -> JSONResponse:
    """The body is read as it arrives and the file streamed into Redis part by part (upload.py), at most
    --max-concurrent-uploads at once on this replica (429 past them, before a byte is read)."""
    state = request.app.state
    active = getattr(state, "uploads_active", 0)
    if active >= gw.settings.max_concurrent_uploads:
        raise RateLimitedError(f"{active} uploads are in progress on this gateway, its limit "
                               "(--max-concurrent-uploads): retry after a moment", retry_after=1)
    state.uploads_active = active + 1
    try:
        return await _upload(request, gw)
    finally:
        state.uploads_active -= 1


async def _upload(request: Request, gw: Gateway) -> JSONResponse:
    file_id = objects.new_file_id()
    store = _store(request)
    writer = store.file_writer(file_id, gw.settings.file_part_bytes)
    committed = False
    try:
        reader = UploadReader(request.headers.get("content-type", ""), writer, gw.settings.max_file_bytes)
        with redis_errors():
            async for chunk in request.stream():
                await reader.feed(chunk)
        reader.finish()
        ttl = _upload_ttl(reader.fields)
        created = now()
        meta = {"id": file_id, "created_at": created, "filename": reader.filename, "purpose": PURPOSE,
                "expires_at": created + ttl}
        if owner_of(request) is not None:
            meta["owner"] = owner_of(request)
        with redis_errors():
            await store.commit_file(meta, writer, ttl)
        committed = True
    finally:
        if not committed:
            with contextlib.suppress(redis.RedisError, OSError):
                await store.discard(writer)
    return JSONResponse(objects.file_object({**meta, "bytes": writer.size}))


def _upload_ttl(fields: dict[str, str]) -> int:
    """The upload's form fields checked (OpenAI's purpose and expires_after); the file's TTL."""
    purpose = fields.get("purpose")
    if purpose is None:
        raise ValidationError("the upload has no `purpose` field: send purpose=batch", param="purpose")
    if purpose != PURPOSE:
        raise ValidationError(f"purpose {echo(repr(purpose))} is not served here: this gateway keeps files for the "
                              "Batch API only (purpose=batch)", param="purpose")
    anchor, seconds = fields.get("expires_after[anchor]"), fields.get("expires_after[seconds]")
    if anchor is None and seconds is None:
        return batchkeys.FILE_TTL
    try:
        ttl = int(seconds) if seconds is not None else None
    except ValueError:
        ttl = None
    if anchor != "created_at" or ttl is None or not batchkeys.FILE_TTL_MIN <= ttl <= batchkeys.FILE_TTL_MAX:
        raise ValidationError(f"expires_after needs anchor 'created_at' and seconds from {batchkeys.FILE_TTL_MIN} "
                              f"to {batchkeys.FILE_TTL_MAX}, got anchor {echo(repr(anchor))}, "
                              f"seconds {echo(repr(seconds))}",
                              param="expires_after")
    return ttl


@router.get(FILES_PATH)
async def list_files(request: Request, gw: Gateway = Depends(gateway), purpose: str | None = None,
                     limit: int = Query(10_000, ge=1, le=10_000), order: Literal["asc", "desc"] = "desc",
                     after: str | None = None) -> JSONResponse:
    with redis_errors():
        found = await _store(request).list_files()
    files = [objects.file_object(meta) for meta in found
             if _visible(meta, request, gw) and (purpose is None or meta["purpose"] == purpose)]
    if order == "desc":
        files.reverse()
    return JSONResponse(objects.page(files, after, limit, "file"))


async def _file(file_id: str, request: Request, gw: Gateway) -> dict:
    with redis_errors():
        meta = await _store(request).file_meta(file_id)
    if not _visible(meta, request, gw):
        raise _no_file(file_id)
    return meta


@router.get(FILES_PATH + "/{file_id}")
async def retrieve_file(file_id: str, request: Request, gw: Gateway = Depends(gateway)) -> JSONResponse:
    return JSONResponse(objects.file_object(await _file(file_id, request, gw)))


@router.get(FILES_PATH + "/{file_id}/content")
async def file_content(file_id: str, request: Request, gw: Gateway = Depends(gateway)) -> StreamingResponse:
    meta = await _file(file_id, request, gw)
    parts = _store(request).file_parts(file_id)
    try:
        with redis_errors():
            first = await anext(parts, b"")
    except FileNotFoundError:  # it expired between the two reads
        raise _no_file(file_id) from None
    return StreamingResponse(_rest(first, parts), media_type="application/octet-stream",
                             headers={"Content-Length": str(meta["bytes"])})


async def _rest(first: bytes, parts: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The file's bytes, one part in memory at a time. Past the first part the status is sent: a file that
    goes meanwhile (deleted, expired) or a Redis gone away ends the body short of its Content-Length, which
    a client sees as a broken download, not as a good file."""
    yield first
    try:
        async for part in parts:
            yield part
    except (FileNotFoundError, redis.RedisError, OSError) as exc:
        log.warning("a file's content was cut short: %r", exc)


@router.delete(FILES_PATH + "/{file_id}")
async def delete_file(file_id: str, request: Request, gw: Gateway = Depends(gateway)) -> JSONResponse:
    await _file(file_id, request, gw)
    with redis_errors():
        await _store(request).delete_file(file_id)
    return JSONResponse({"id": file_id, "object": "file", "deleted": True})


# -- batches -------------------------------------------------------------------------------------------

@router.post("/v1/batches")
async def create_batch(body: BatchBody, request: Request, gw: Gateway = Depends(gateway)) -> JSONResponse:
    if body.endpoint != ENDPOINT:
        raise ValidationError(f"endpoint {echo(repr(body.endpoint))} is not served here: this gateway runs embedding "
                              f"batches only (endpoint {ENDPOINT})", param="endpoint")
    if body.completion_window != WINDOW:
        raise ValidationError(f"completion_window {echo(repr(body.completion_window))} is not supported: only "
                              f"{WINDOW!r}", param="completion_window")
    source = await _file(body.input_file_id, request, gw)
    if source["purpose"] != PURPOSE:
        raise ValidationError(f"file {echo(body.input_file_id)} has purpose {echo(repr(source['purpose']))}: a "
                              "batch's input file is one uploaded with purpose=batch", param="input_file_id")
    store = _store(request)
    created = now()
    meta = {"id": objects.new_batch_id(), "endpoint": body.endpoint, "input_file_id": body.input_file_id,
            "completion_window": body.completion_window, "created_at": created,
            "expires_at": created + round(gw.settings.batch_completion_seconds), "metadata": body.metadata,
            "output_ttl": body.output_expires_after.seconds if body.output_expires_after else None}
    if owner_of(request) is not None:
        meta["owner"] = owner_of(request)
    traceparent, tracestate = traced.current()
    if traceparent is not None:  # each line's trace links to this request's (docs/tracing.md)
        meta["traceparent"], meta["tracestate"] = traceparent, tracestate
    with redis_errors():
        if not await store.create_batch(meta):  # the input file went since it was read
            raise _no_file(body.input_file_id)
        batch = await store.batch(meta["id"])
    _runner(request).poke()
    return JSONResponse(objects.batch_object(batch))


async def _batch(batch_id: str, request: Request, gw: Gateway) -> dict:
    with redis_errors():
        batch = await _store(request).batch(batch_id)
    if batch is None or not _visible(batch["meta"], request, gw):
        raise _no_batch(batch_id)
    return batch


@router.get("/v1/batches/{batch_id}")
async def retrieve_batch(batch_id: str, request: Request, gw: Gateway = Depends(gateway)) -> JSONResponse:
    return JSONResponse(objects.batch_object(await _batch(batch_id, request, gw)))


@router.get("/v1/batches")
async def list_batches(request: Request, gw: Gateway = Depends(gateway), after: str | None = None,
                       limit: int = Query(20, ge=1, le=100)) -> JSONResponse:
    with redis_errors():
        found = await _store(request).list_batches()
    batches = [objects.batch_object(batch) for batch in reversed(found) if _visible(batch["meta"], request, gw)]
    return JSONResponse(objects.page(batches, after, limit, "batch"))


@router.post("/v1/batches/{batch_id}/cancel")
async def cancel_batch(batch_id: str, request: Request, gw: Gateway = Depends(gateway)) -> JSONResponse:
    await _batch(batch_id, request, gw)
    try:
        with redis_errors():
            found = await _store(request).transition(batch_id, ("validating", "in_progress"), "cancelling",
                                                     cancelling_at=now())
    except BatchGone:  # it expired since the read above
        raise _no_batch(batch_id) from None
    if found is not None and found not in ("cancelling", "cancelled"):
        raise JobNotCancellableError(f"batch {echo(batch_id)} is {found}: only a validating or in_progress batch can "
                                     "be cancelled", param="batch_id")
    _runner(request).poke()
    return JSONResponse(objects.batch_object(await _batch(batch_id, request, gw)))
