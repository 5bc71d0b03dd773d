"""A settled job as one JSON object: what the events stream and webhooks send for it."""

from __future__ import annotations

from embedfleet.common.errors import EmbedfleetError
from embedfleet.common.result import Result
from embedfleet.producer.client.core import result_state
from embedfleet.producer.gateway.core.encoding import embeddings_body
from embedfleet.producer.gateway.core.errors import error_body


def job_body(result: Result, options: dict) -> dict:
    """GET /v1/jobs/{id}'s 200 body for a finished job; for a failed or cancelled one, its error in
    OpenAI's shape beside `id` and `status`. `bytes`/`bytes_only` jobs get their stored bytes in base64
    (a JSON body cannot carry raw bytes), as vLLM's base64 with an explicit layout."""
    if not result.ok:
        return {"id": result.id, "object": "job", "status": result_state(result), **error_body(result.error)}
    encoding_format, explicit = options["encoding_format"], options["explicit_layout"]
    if encoding_format in ("bytes", "bytes_only"):
        encoding_format, explicit = "base64", True
    return {**embeddings_body(result, encoding_format, explicit), "status": "finished"}


def unsettled_body(job_id: str, status: str, err: EmbedfleetError | None = None) -> dict:
    """A job that has no result (yet): its status, and the error that says why, if any."""
    return {"id": job_id, "object": "job", "status": status, **(error_body(err) if err else {})}
