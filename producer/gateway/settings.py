"""The gateway's settings: every field is a flag and an EMBEDFLEET_ env var, built once in main()."""

from __future__ import annotations

from pydantic import Field, PrivateAttr, model_validator

from embedfleet.common.config import Settings
from embedfleet.common.protocol import batchkeys
from embedfleet.common.tracing import OTLP_ENDPOINT_HELP
from embedfleet.producer.gateway.core.apikeys import ApiKey, parse_api_keys
from embedfleet.producer.gateway.jobs.webhookurls import WebhookPolicy


class GatewaySettings(Settings):
    host: str = Field("127.0.0.1", description="interface to listen on")
    port: int = Field(8000, description="TCP port to listen on")
    api_key: str | None = Field(None, repr=False, description="when set, every route but /health needs "
                                                               "`Authorization: Bearer KEY`")
    api_keys: str | None = Field(None, repr=False, description="several keys, each with a weight and an "
                                 "optional rate: a JSON object {KEY: {name, weight, rate, burst}} inline or as "
                                 "@FILE (producer/gateway/core/apikeys.py); every route but /health then needs one")
    # Bounded by default: unbounded, a flood of requests (each a coroutine, its parsed body and, later, its
    # result) grows memory until the process dies, where 429 lets clients back off. 1024 per process is
    # Little's law with room to spare (1,000 requests/s answered in 1 s each), far above what one replica
    # holds in normal use; it bounds the held bodies at 1024 x --max-body-bytes (MBs at typical sizes).
    max_in_flight: int = Field(1024, ge=1, description="requests this gateway holds waiting for results; past it "
                               "new ones get 429 rate_limited (with API keys: each key past its weighted share)")
    max_inputs: int = Field(2048, ge=1, description="inputs allowed in one request (the model's own limit "
                                                    "also applies)")
    tei_model: str | None = Field(None, description="the served model that TEI's routes (/embed, /rerank, /info, "
                                  "...) use when a request names none; each model is also at /tei/<model>/")
    max_body_bytes: int = Field(8 * 1024 * 1024, ge=1, description="largest request body accepted, in bytes")
    # Far above a real request (a Cohere body of 2,048 one-part inputs holds about 6,150 keys) and far below
    # what stalls the event loop (FastAPI builds one error per unknown key): producer/gateway/core/limits.py.
    max_body_keys: int = Field(16_384, ge=64, description="most JSON object keys a request body may hold in all "
                               "(a body with more is answered 413 payload_too_large before it is validated)")
    # h11's own default (16 KiB), as Node's; nginx allows 4 x 8 KiB. A larger head is answered 431.
    max_header_bytes: int = Field(16 * 1024, ge=1024, description="largest request line plus headers accepted, in "
                                  "bytes (a larger one is answered 431 headers_too_large)")
    max_queue_depth: int | None = Field(10_000, ge=1, description="refuse new requests (429) while a model's "
                                                                  "queue holds this many")
    request_timeout: float = Field(60.0, gt=0, description="seconds /v1/embeddings and /pooling wait for a "
                                                           "result before answering 504")
    max_wait: float = Field(60.0, ge=0, description="longest long-poll, in seconds, that GET /v1/jobs/{id}"
                                                    "?wait= may ask for")
    retry_after: int = Field(1, ge=0, description="seconds sent in Retry-After with 429 and 503 answers")
    log_level: str = Field("info", description="uvicorn log level")
    access_log: bool = Field(True, description="log every HTTP request (uvicorn's access log; `embedfleet up` "
                                               "turns it off unless given --access-log)")
    webhook_secret: str | None = Field(None, repr=False, description="key of the HMAC-SHA256 signature sent with "
                                       "each webhook (X-Embedfleet-Signature-256); without it POST /v1/jobs "
                                       "refuses a `webhook`")
    webhook_attempts: int = Field(6, ge=1, description="tries per webhook delivery (a 5xx, 429, timeout or "
                                                       "refused connection is retried, doubling the pause)")
    webhook_timeout: float = Field(10.0, gt=0, description="seconds one webhook POST may take")
    webhook_allow_http: bool = Field(False, description="let webhooks go to plain http:// URLs too (default: "
                                     "https only)")
    webhook_allow_hosts: str | None = Field(None, description="host names, addresses and CIDR networks, comma-"
                                            "separated, that webhooks may go to although they are not public "
                                            "(e.g. hooks.internal,10.8.0.0/16); everything else must be public "
                                            "(producer/gateway/jobs/webhookurls.py)")
    webhook_sweep_seconds: float = Field(5.0, gt=0, description="seconds between this replica's sweeps of the "
                                         "fleet's webhook delivery list (results no replica was woken for)")
    max_event_ids: int = Field(1000, ge=1, description="job ids one GET /v1/jobs/events stream may follow")
    # The Batch API (producer/gateway/batches/, docs/batch-api.md): files and batches live in Redis.
    max_file_bytes: int = Field(64 * 1024 * 1024, ge=1, description="largest file POST /v1/files accepts, in "
                                "bytes (files are kept in Redis; a larger one is refused with 413)")
    file_part_bytes: int = Field(1024 * 1024, ge=1024, description="a file is kept in Redis in parts of at "
                                 "most this many bytes (uploads and batch output files alike): keep it below "
                                 "Redis's proto-max-bulk-len (512 MB by default, 1 MB at its lowest)")
    max_concurrent_uploads: int = Field(4, ge=1, description="POST /v1/files uploads this replica takes at once; "
                                        "past it: 429 rate_limited with Retry-After (each holds about two parts "
                                        "in memory while it streams into Redis)")
    batch_in_flight: int = Field(256, ge=1, description="lines of one batch submitted and not yet answered, at "
                                 "most (the rest wait in Redis, not in the queue)")
    batch_lease_seconds: float = Field(batchkeys.BATCH_LEASE, gt=0, description="a replica's claim on a batch it "
                                       "drives lasts this long without a renewal (renewed every third): a "
                                       "replica that dies frees its batches for another this soon")
    batch_max_running: int = Field(4, ge=0, description="batches one gateway replica drives at once (0: it "
                                   "answers the batch routes and leaves the running to other replicas)")
    batch_poll_seconds: float = Field(1.0, gt=0, description="seconds between a replica's looks for batches "
                                      "to drive (a batch created on it is started at once)")
    batch_completion_seconds: float = Field(24 * 3600, gt=0, description="what completion_window '24h' grants: "
                                            "a batch still running this long after its creation expires (lower "
                                            "it only to test expiry)")
    otlp_endpoint: str | None = Field(None, description=OTLP_ENDPOINT_HELP)
    _keys: dict[str, ApiKey] = PrivateAttr(default_factory=dict)
    _webhook_policy: WebhookPolicy = PrivateAttr(default_factory=WebhookPolicy)

    @model_validator(mode="after")
    def _parse_keys(self):
        self._keys = parse_api_keys(self.api_keys, self.api_key)  # a bad file stops the start, in one line
        self._webhook_policy = WebhookPolicy.from_flags(self.webhook_allow_http, self.webhook_allow_hosts)
        return self

    @property
    def webhook_policy(self) -> WebhookPolicy:
        """Where webhooks may go: --webhook-allow-http and --webhook-allow-hosts, parsed once."""
        return self._webhook_policy

    @property
    def keys(self) -> dict[str, ApiKey]:
        """Every accepted API key (--api-key and --api-keys) with its options; empty: the gateway is open."""
        return self._keys
