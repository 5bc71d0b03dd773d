"""OpenAI's object shapes for what the store keeps: FileObject, Batch, and the list pages around them
(the `openai` package's openai.types.FileObject / Batch / SyncCursorPage parse these unchanged)."""

from __future__ import annotations

import hashlib
import json
import uuid

from embedfleet.common.errors import NotFoundError, echo

STATUS_TIMES = ("in_progress", "finalizing", "completed", "failed", "expired", "cancelling", "cancelled")
ENDED = ("completed", "failed", "expired", "cancelled")


def new_file_id() -> str:
    return f"file-{uuid.uuid4().hex[:24]}"


def new_batch_id() -> str:
    return f"batch_{uuid.uuid4().hex}"


def output_file_id(batch_id: str, which: str) -> str:
    """The id of a batch's `output` or `error` file: derived from the batch, so that a replica that
    finishes the batch again (the first one died while writing) writes the same files, not new ones."""
    return f"file-{hashlib.sha256(f'{batch_id}:{which}'.encode()).hexdigest()[:24]}"


def file_object(meta: dict) -> dict:
    """OpenAI's FileObject from a stored file's meta (the owner stays inside)."""
    return {"id": meta["id"], "object": "file", "bytes": meta["bytes"], "created_at": meta["created_at"],
            "filename": meta["filename"], "purpose": meta["purpose"], "status": "processed",
            "expires_at": meta.get("expires_at"), "status_details": None}


def _int(batch: dict, name: str) -> int | None:
    value = batch.get(name)
    return None if value in (None, "") else int(value)


def batch_object(batch: dict) -> dict:
    """OpenAI's Batch from a stored batch (store.Store.batch)."""
    meta = batch["meta"]
    errors = json.loads(batch["errors"]) if batch.get("errors") else None
    tokens = _int(batch, "input_tokens") or 0
    return {
        "id": meta["id"], "object": "batch", "endpoint": meta["endpoint"],
        "errors": {"object": "list", "data": errors} if errors else None,
        "input_file_id": meta["input_file_id"], "completion_window": meta["completion_window"],
        "status": batch["status"], "output_file_id": batch.get("output_file_id") or None,
        "error_file_id": batch.get("error_file_id") or None, "created_at": meta["created_at"],
        **{f"{status}_at": _int(batch, f"{status}_at") for status in STATUS_TIMES},
        "expires_at": meta["expires_at"],
        "request_counts": {"total": _int(batch, "total") or 0, "completed": _int(batch, "completed") or 0,
                           "failed": _int(batch, "failed") or 0},
        "metadata": meta.get("metadata"), "model": batch.get("model") or None,
        "usage": {"input_tokens": tokens, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 0,
                  "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": tokens},
    }


def page(items: list[dict], after: str | None, limit: int, what: str) -> dict:
    """OpenAI's cursor page over `items` (already in the listing's order): those after the id `after`."""
    if after is not None:
        ids = [item["id"] for item in items]
        if after not in ids:
            raise NotFoundError(f"`after`: no {what} with id {echo(after)} (a cursor is the id of an item of an "
                                "earlier page)", param="after")
        items = items[ids.index(after) + 1:]
    data = items[:limit]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": len(items) > limit}
