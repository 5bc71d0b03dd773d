"""POST /v1/jobs' request body."""

from __future__ import annotations

from pydantic import Field

from embedfleet.producer.gateway.core.schemas import EmbedBody


class JobBody(EmbedBody):
    """POST /v1/jobs: the embeddings body, plus where to POST the result when it lands."""

    # The URL's rules (https, a public host, no credentials) are the gateway's policy, checked with its
    # flags in producer/gateway/jobs/webhookurls.py: one message that says what is allowed, not a regex's.
    webhook: str | None = Field(None, max_length=2048,
                                description="https URL of a public host the gateway POSTs the job's result to, "
                                            "signed (X-Embedfleet-Signature-256), retried on failure")
