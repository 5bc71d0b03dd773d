"""Every Redis key embedfleet uses, on one page (rq's own keys are listed for the full picture). The fleet's keys are
built here, rq's in rqkeys.py, the Batch API's in batchkeys.py; a TTL named in capitals is common/policy.py's, or
beside the keys it is for. Each concept's own detail is told where its operations are: the queue in enqueueing.py,
claims and leases in claims.py, answers in answering.py, adverts in adverts.py, in-flight dedup in dedup.py.

    embedfleet:result:<id>          STRING  result blob (common.result), TTL RESULT_TTL
    embedfleet:notify:<id>          LIST    one element pushed when the result of a request without a reply
                                            stream lands (answering.py), TTL RESULT_TTL
    embedfleet:replies:<producer>   STREAM  one entry {id} per finished request of an AsyncProducer (its
                                            `reply_to`), MAXLEN ~REPLY_STREAM_MAXLEN, TTL RESULT_TTL; an
                                            entry {kick} restarts its own listener's XREAD with the streams
                                            of other producers' requests it waits on (producer/client/replies.py)
    embedfleet:kick:<producer>      LIST    an AsyncProducer's own: one element interrupts its BLPOP over many
                                            notify lists so that it starts again with the ids waited for
                                            now (producer/client/notify.py), TTL KICK_TTL
    embedfleet:models               SET     names of every model ever advertised; never pruned (adverts.py)
    embedfleet:model:<name>         STRING  ModelCapabilities (msgpack), TTL ADVERTISE_TTL, refreshed
                                            every HEARTBEAT_INTERVAL by each worker serving <name>
    embedfleet:model:<name>:workers ZSET    worker name -> time of its last heartbeat, TTL 2 * ADVERTISE_TTL
    embedfleet:worker:<worker>      STRING  one worker's own facts (adverts.py), TTL ADVERTISE_TTL, refreshed
                                            with the advert and each heartbeat
    embedfleet:job:<id>             STRING  the HTTP gateway's answer options for an async job (JSON, answering.py
                                            `save_job_options`), TTL JOB_TTL + RESULT_TTL while the job waits,
                                            then its result's
    embedfleet:chunks:<id>          HASH    a long request spread over the fleet as sub-jobs <id>-p<k>
                                            (worker/serving/spread.py, answering.py `join`); TTL CHUNKS_TTL,
                                            deleted once the request is answered
    embedfleet:replies:webhooks     STREAM  the reply stream of every gateway job with a webhook, shared by the
                                            gateway replicas (each reads all of it: a fast wake-up only)
    embedfleet:webhooks             ZSET    job id -> when a gateway should next look at its webhook (unix s):
                                            the durable delivery list that any replica drains; a member
                                            leaves once delivered, given up, or its job and result expired
    embedfleet:webhook:<id>         STRING  a replica's claim on delivering <id>'s webhook, TTL WEBHOOK_LEASE
                                            (a replica that dies mid-delivery frees it: another redelivers)
    embedfleet:cache:<model>:<in>   STRING  one pooled float32 vector (worker/serving/cache.py); <model> = the
                                            worker's model identity, <in> = digest of (prompt length, token ids);
                                            TTL the worker's --cache-ttl (CACHE_TTL). On the queue's Redis by
                                            default, or on --cache-url's (an LRU Redis of its own)
    embedfleet:inflight:<digest>    STRING  the id of the request a worker is computing for this digest of
                                            (model identity, model, inputs, params) (dedup.py); TTL
                                            INFLIGHT_TTL, renewed by its worker's heartbeat, deleted once it
                                            is answered. On the queue's Redis (it is read with the results)

    OpenAI's Batch API (producer/gateway/batches/), on the gateway's own Redis (--redis-url; batchkeys.py):
    embedfleet:file:<file_id>       HASH    one file of /v1/files: `meta` and its bytes in parts; TTL its
                                            `expires_after` (default FILE_TTL)
    embedfleet:file:<file_id>:upload  HASH  a file being written, part by part; TTL FILE_UPLOAD_TTL
    embedfleet:files                ZSET    file id -> created_at (ms): GET /v1/files
    embedfleet:batch:<batch_id>     HASH    one batch: `meta`, `status`, its counts and file ids; TTL BATCH_TTL
    embedfleet:batch:<batch_id>:input  HASH  the input file's hash, copied at create; TTL BATCH_TTL
    embedfleet:batch:<batch_id>:lines  HASH  line index -> its output or error line (JSON); TTL the batch's
    embedfleet:batch:<batch_id>:lease  STRING  the token of the gateway replica driving the batch; TTL its lease
    embedfleet:batches              ZSET    batch id -> created_at (ms): GET /v1/batches
    embedfleet:batches:active       ZSET    batch id -> created_at (ms) of every batch not yet ended

    Every key above expires but embedfleet:webhooks. The only keys without a TTL are shared, one per model or
    per fleet: embedfleet:models, embedfleet:webhooks, embedfleet:files, embedfleet:batches,
    embedfleet:batches:active, rq:queues, rq:queue:<queue>,
    embedfleet:queued_tokens:<queue> and rq's registries.

    rq:queue:<queue>                LIST    pending job ids; <queue> = queue_name(model, priority): one queue
                                            per level of PRIORITIES (interactive: embedfleet.<model>, bulk:
                                            embedfleet.<model>@bulk), each with rq's own registries below
    rq:queue:<queue>:intermediate   LIST    rq's own dequeue parks ids here; embedfleet workers never do: their
                                            take moves ids straight into rq:wip:<queue>
    rq:queues                       SET     every queue's key (rq lists its queues there; enqueue adds)
    rq:job:<id>                     HASH    the rq job (rqkeys.py: our fields besides rq's); job id = request id;
                                            TTL JOB_KEY_TTL while queued, then as rqkeys.py says
    embedfleet:queued_tokens:<queue>  STRING  estimated tokens of the jobs in rq:queue:<queue> (enqueueing.py).
                                            No TTL: one per queue, like the queue itself
    rq:wip:<queue>                  ZSET    rq's started registry: member <id>:<execution>, score = the
                                            claim's lease end + LEASE_GRACE (Redis server clock)
    rq:execution:<id>:<execution>   HASH    rq's record of one run of a job, TTL the lease + grace; full only
    rq:executions:<id>              ZSET    a job's runs, TTL the lease + grace + 60; full only
    rq:results:<id>                 STREAM  rq's result record of a FAILED job, TTL FAILURE_TTL
    rq:finished:<queue>             ZSET    rq's finished registry (score: when the entry expires); full only
    rq:failed:<queue>               ZSET    rq's failed registry (score: when the entry expires)
    rq:canceled:<queue>             ZSET    rq's cancelled registry (score: when cancelled), kept CANCELED_TTL
    rq:worker:<name>, rq:workers, rq:workers:<queue>  HASH/SET  rq worker registration (rq's own)
    rq:worker:<name>:executions     SET     the executions a worker holds (take adds, finish removes); full only
    rq:suspended                    STRING  set by `rq suspend`: take takes nothing while it exists
    rq:clean_registries:<queue>, rq:clean_groups  STRING  rq's own maintenance locks (short TTL)

Redis Cluster (a redis+cluster:// URL, common/redisclient.py). Every script and every MULTI must touch keys of
one hash slot, so there a model's keys carry its hash tag, `{<10 hex of sha1(model)>}` (common/names.py slot_tag),
in front: its queue names ({t}embedfleet.<model>, {t}embedfleet.<model>@bulk: rq:queue:{t}embedfleet.<model>, its
registries, its queued_tokens), its request ids ({t}<32 hex>: rq:job:, embedfleet:result:, notify:,
job:, chunks:, rq:execution(s):, rq:results: of the id, and a spread request's parts <id>-p<k>), its
workers' names ({t}<name>: rq:worker:<name>, rq:worker:<name>:executions), an AsyncProducer's reply
stream and kick list (one per tag: embedfleet:replies:{t}<hex>), in-flight markers (embedfleet:inflight:{t}
<digest>) and rq:suspended's stand-in rq:suspended:{t}. A model's traffic is one slot, so one master. The
shared keys (rq:queues, embedfleet:models, adverts, the webhook stream and list) are written outside the
scripts there (a webhook job's answer wakes no stream: the sweeps deliver it). On a plain Redis nothing
carries a tag: the layout above is unchanged. docs/capacity.md#redis-cluster has the whole picture.
"""

from __future__ import annotations

import re

from embedfleet.common.names import ID_CHARS, PRIORITIES, valid_request_id
from embedfleet.common.policy import JOB_TTL, RESULT_TTL

PREFIX = "embedfleet"

_REPLY_STREAM = re.compile(re.escape(f"{PREFIX}:replies:") + ID_CHARS)


def is_reply_stream_key(key: str | bytes) -> bool:
    """True if `key` lies in the reply-stream key space (reply_stream_key): the only keys a request's
    `reply_to` may name, so that a worker never writes to a key it was merely told about."""
    if isinstance(key, bytes):
        key = key.decode("ascii", "replace")
    return isinstance(key, str) and _REPLY_STREAM.fullmatch(key) is not None


def queue_name(model: str, priority: str = "interactive", tag: str = "") -> str:
    """The rq queue of `model` at `priority`; the interactive level keeps the name queues always had.
    `tag`: the model's hash tag on a Redis Cluster (slot_tag), '' on a plain Redis."""
    if priority not in PRIORITIES:
        raise ValueError(f"unknown priority {priority!r}: one of {', '.join(PRIORITIES)}")
    return tag + (f"{PREFIX}.{model}" if priority == "interactive" else f"{PREFIX}.{model}@{priority}")


def queued_tokens_key(queue: str) -> str:
    """The estimated tokens waiting in rq queue `queue` (a queue_name), for autoscaling gauges."""
    return f"{PREFIX}:queued_tokens:{queue}"


# Per-request key prefixes (the Lua scripts get them by these names: common/protocol/scripts.py).
RESULT_PREFIX = f"{PREFIX}:result:"
NOTIFY_PREFIX = f"{PREFIX}:notify:"
JOB_OPTIONS_PREFIX = f"{PREFIX}:job:"
CHUNKS_PREFIX = f"{PREFIX}:chunks:"


def result_key(request_id: str) -> str:
    return RESULT_PREFIX + request_id


def notify_key(request_id: str) -> str:
    return NOTIFY_PREFIX + request_id


def job_options_key(request_id: str) -> str:
    return JOB_OPTIONS_PREFIX + request_id


def reply_stream_key(producer_id: str) -> str:
    return f"{PREFIX}:replies:{producer_id}"


def chunks_key(request_id: str) -> str:
    return CHUNKS_PREFIX + request_id


def part_id(request_id: str, index: int) -> str | None:
    """The rq job id of part `index` of a spread request; None where it would not be a valid request id."""
    part = f"{request_id}-p{index}"
    return part if valid_request_id(part) else None


CHUNKS_TTL = JOB_TTL + RESULT_TTL  # a spread request's parts may wait in the queue as long as any job

REPLY_STREAM_MAXLEN = 10_000


def kick_key(producer_id: str) -> str:
    return f"{PREFIX}:kick:{producer_id}"


KICK_TTL = 60  # a kick list outlives its producer by at most this long

WEBHOOK_STREAM = reply_stream_key("webhooks")
WEBHOOKS_KEY = f"{PREFIX}:webhooks"
WEBHOOK_LEASE = 300  # seconds a claim on a delivery lasts: longer than all its attempts together


def webhook_claim_key(request_id: str) -> str:
    return f"{PREFIX}:webhook:{request_id}"

MODELS_KEY = f"{PREFIX}:models"


def model_key(model: str) -> str:
    return f"{PREFIX}:model:{model}"


def model_workers_key(model: str) -> str:
    return f"{PREFIX}:model:{model}:workers"


def worker_info_key(worker_name: str) -> str:
    return f"{PREFIX}:worker:{worker_name}"


def cache_key(model_identity: str, input_digest: str) -> str:
    return f"{PREFIX}:cache:{model_identity}:{input_digest}"


def inflight_key(request_digest: str, tag: str = "") -> str:
    """`tag`: the hash tag of the requests that share it (their ids', on a Redis Cluster), so that the
    in-flight scripts touch one slot with the leader's result."""
    return f"{PREFIX}:inflight:{tag}{request_digest}"
