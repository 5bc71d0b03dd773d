"""OpenAI's /v1/files and /v1/batches routes (the `openai` client's files.* and batches.* calls).

With API keys, files and batches belong to the key that created them (its fingerprint, as jobs do:
producer/gateway/owners.py): another key's file or batch is answered exactly as one that does not exist.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, File, Form, Query, Request, UploadFile
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from common.errors import NotFoundError, PayloadTooLargeError, ValidationError
from common.protocol import keys
from producer.client.core import redis_errors
from producer.gateway.auth import require_key
from producer.gateway.batches import objects
from producer.gateway.batches.lines import ENDPOINT
from producer.gateway.batches.runner import Runner
from producer.gateway.batches.store import BatchGone, Store, now
from producer.gateway.errors import JobNotCancellableError
from producer.gateway.owners import may_see, owner_of
from producer.gateway.service import Gateway, gateway

router = APIRouter(dependencies=[Depends(require_key)])

PURPOSE = "batch"  # the only purpose this gateway keeps files for
WINDOW = "24h"  # the only completion_window OpenAI offers
FILES_PATH = "/v1/files"


class ExpiresAfter(BaseModel):
    model_config = ConfigDict(extra="forbid")

    anchor: Literal["created_at"]
    seconds: int = Field(ge=keys.FILE_TTL_MIN, le=keys.FILE_TTL_MAX)


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
    return NotFoundError(f"no file with id {file_id} (never uploaded, deleted, or expired)", param="file_id")


def _no_batch(batch_id: str) -> NotFoundError:
    return NotFoundError(f"no batch with id {batch_id} (never created, or expired)", param="batch_id")


# -- files ---------------------------------------------------------------------------------------------

@router.post(FILES_PATH)
async def create_file(request: Request, file: Annotated[UploadFile, File()], purpose: Annotated[str, Form()],
                      anchor: Annotated[str | None, Form(alias="expires_after[anchor]")] = None,
                      seconds: Annotated[int | None, Form(alias="expires_after[seconds]")] = None,
                      gw: Gateway = Depends(gateway)) -> JSONResponse:
    if purpose != PURPOSE:
        raise ValidationError(f"purpose {purpose!r} is not served here: this gateway keeps files for the Batch "
                              "API only (purpose=batch)", param="purpose")
    ttl = keys.FILE_TTL
    if anchor is not None or seconds is not None:
        if anchor != "created_at" or seconds is None or not keys.FILE_TTL_MIN <= seconds <= keys.FILE_TTL_MAX:
            raise ValidationError(f"expires_after needs anchor 'created_at' and seconds from {keys.FILE_TTL_MIN} "
                                  f"to {keys.FILE_TTL_MAX}, got anchor {anchor!r}, seconds {seconds!r}",
                                  param="expires_after")
        ttl = seconds
    limit = gw.settings.max_file_bytes
    data = await file.read(limit + 1)
    if len(data) > limit:
        raise PayloadTooLargeError(f"the file is larger than this gateway's limit of {limit} bytes (files are kept "
                                   "in Redis; --max-file-bytes): split the batch into several files",
                                   param="file")
    created = now()
    meta = {"id": objects.new_file_id(), "bytes": len(data), "created_at": created,
            "filename": file.filename or "upload.jsonl", "purpose": PURPOSE, "expires_at": created + ttl}
    if owner_of(request) is not None:
        meta["owner"] = owner_of(request)
    with redis_errors():
        await _store(request).put_file(meta, data, ttl)
    return JSONResponse(objects.file_object(meta))


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
async def file_content(file_id: str, request: Request, gw: Gateway = Depends(gateway)) -> Response:
    await _file(file_id, request, gw)
    with redis_errors():
        data = await _store(request).file_data(file_id)
    if data is None:  # it expired between the two reads
        raise _no_file(file_id)
    return Response(data, media_type="application/octet-stream")


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
        raise ValidationError(f"endpoint {body.endpoint!r} is not served here: this gateway runs embedding "
                              f"batches only (endpoint {ENDPOINT})", param="endpoint")
    if body.completion_window != WINDOW:
        raise ValidationError(f"completion_window {body.completion_window!r} is not supported: only {WINDOW!r}",
                              param="completion_window")
    source = await _file(body.input_file_id, request, gw)
    if source["purpose"] != PURPOSE:
        raise ValidationError(f"file {body.input_file_id} has purpose {source['purpose']!r}: a batch's input "
                              "file is one uploaded with purpose=batch", param="input_file_id")
    store = _store(request)
    with redis_errors():
        data = await store.file_data(body.input_file_id)
    if data is None:
        raise _no_file(body.input_file_id)
    created = now()
    meta = {"id": objects.new_batch_id(), "endpoint": body.endpoint, "input_file_id": body.input_file_id,
            "completion_window": body.completion_window, "created_at": created,
            "expires_at": created + round(gw.settings.batch_completion_seconds), "metadata": body.metadata,
            "output_ttl": body.output_expires_after.seconds if body.output_expires_after else None}
    if owner_of(request) is not None:
        meta["owner"] = owner_of(request)
    with redis_errors():
        await store.create_batch(meta, data)
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
        raise JobNotCancellableError(f"batch {batch_id} is {found}: only a validating or in_progress batch can "
                                     "be cancelled", param="batch_id")
    _runner(request).poke()
    return JSONResponse(objects.batch_object(await _batch(batch_id, request, gw)))
