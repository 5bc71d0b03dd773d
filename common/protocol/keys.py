"""Every Redis key and TTL embedfleet uses (rq's own keys are listed for the full picture).

    embedfleet:result:<id>          STRING  result blob (common.result), TTL RESULT_TTL
    A request is woken one way, which its job says: through its `reply_to` stream when it has one, else
    through its notify list; never both (lib.lua `publish`). A waiter that did not submit the request reads
    the job's `reply_to` to know which (producer/client/waiters.py, blocking.py).
    embedfleet:notify:<id>          LIST    one element pushed when the result of a request without a reply
                                            stream lands (BLMOVE onto itself or BLPOP wakes its waiters),
                                            TTL RESULT_TTL
    embedfleet:replies:<producer>   STREAM  one entry {id} per finished request of an AsyncProducer (its
                                            `reply_to`), MAXLEN ~REPLY_STREAM_MAXLEN, TTL RESULT_TTL; an
                                            entry {kick} restarts its own listener's XREAD with the streams
                                            of other producers' requests it waits on (producer/client/replies.py)
    embedfleet:kick:<producer>      LIST    an AsyncProducer's own: one element interrupts its BLPOP over many
                                            notify lists so that it starts again with the ids waited for
                                            now (producer/client/notify.py), TTL KICK_TTL
    embedfleet:models               SET     names of every model ever advertised; never pruned: a name
                                            without a live worker is answered 503 no_worker (known model,
                                            none serving now), a name never seen 404 unknown model
    embedfleet:model:<name>         STRING  ModelCapabilities (msgpack), TTL ADVERTISE_TTL, refreshed
                                            every HEARTBEAT_INTERVAL by each worker serving <name>
    embedfleet:model:<name>:workers ZSET    worker name -> time of its last heartbeat, TTL 2 * ADVERTISE_TTL
    embedfleet:worker:<worker>      STRING  one worker's own facts (msgpack: model, device, dtype, batch
                                            budget and where it came from; and what changes, rewritten at
                                            each heartbeat: state, the round on its device, texts/s over
                                            the last minute, 10 minutes of 10-s buckets; worker/serving/livestats.py),
                                            TTL ADVERTISE_TTL, refreshed with the advert and each heartbeat
    embedfleet:job:<id>             STRING  the HTTP gateway's answer options for an async job (JSON:
                                            encoding_format, explicit layout, webhook URL, and with API
                                            keys its owner: a fingerprint of the key,
                                            producer/gateway/core/owners.py), TTL JOB_TTL +
                                            RESULT_TTL while the job waits; saving it marks the job
                                            (`options`), and the answer of a marked job gives it the result's
                                            TTL in the same script (a job taken before its mark keeps it its
                                            full time; a job dropped unserved outlives it by RESULT_TTL)

    embedfleet:chunks:<id>          HASH    a long request spread over the fleet as sub-jobs <id>-p<k>
                                            (worker/serving/spread.py): `plan` (msgpack: the request, each chunk's
                                            input and token count), `parts`, `done`, `part:<k>` (a part's
                                            result blob), `failed` (the first failed part's error blob);
                                            TTL CHUNKS_TTL, deleted once the request is answered
    embedfleet:replies:webhooks     STREAM  the reply stream of every gateway job with a webhook, shared by the
                                            gateway replicas (each reads all of it: a fast wake-up only)
    embedfleet:webhooks             ZSET    job id -> when a gateway should next look at its webhook (unix s):
                                            the durable delivery list that any replica drains; a member
                                            leaves once delivered, given up, or its job and result expired
    embedfleet:webhook:<id>         STRING  a replica's claim on delivering <id>'s webhook, TTL WEBHOOK_LEASE
                                            (a replica that dies mid-delivery frees it: another redelivers)
    embedfleet:cache:<model>:<in>   STRING  one pooled float32 vector (little-endian, the model's width), the
                                            forward pass's output before cut/normalise/cast (worker/serving/cache.py);
                                            <model> = the worker's model identity (name, digest of its files,
                                            dtype, device kind), <in> = digest of (prompt length, token ids);
                                            TTL the worker's --cache-ttl (CACHE_TTL). On the queue's Redis by
                                            default, or on --cache-url's (an LRU Redis of its own)
    embedfleet:inflight:<digest>    STRING  the id of the request a worker is computing for this digest of
                                            (model identity, model, inputs, params): identical requests taken
                                            meanwhile wait for its answer (worker/serving/inflight.py); TTL
                                            INFLIGHT_TTL, renewed by its worker's heartbeat, deleted once it
                                            is answered. On the queue's Redis (it is read with the results)

    OpenAI's Batch API (producer/gateway/batches/), on the gateway's own Redis (--redis-url):
    embedfleet:file:<file_id>       HASH    one file of /v1/files: `meta` (JSON: OpenAI's FileObject fields,
                                            `parts` and, with API keys, the owner's fingerprint) and its bytes
                                            in `part:0` .. `part:<parts - 1>`, each at most the gateway's
                                            --file-part-bytes (no value near Redis's proto-max-bulk-len; a
                                            file of before parts has one `data` field); TTL its
                                            `expires_after` (default FILE_TTL)
    embedfleet:file:<file_id>:upload  HASH  a file being written (an upload, or a batch's output file), part
                                            by part; RENAMEd to embedfleet:file:<file_id> once whole; TTL
                                            FILE_UPLOAD_TTL (an upload that died leaves nothing for long)
    embedfleet:files                ZSET    file id -> created_at (ms): GET /v1/files; a member whose file
                                            expired is dropped by the next listing, one older than
                                            FILE_TTL_MAX by the next upload
    embedfleet:batch:<batch_id>     HASH    one batch: `meta` (JSON: the Batch fields fixed at create), `status`,
                                            each `<status>_at`, `total`, `completed`, `failed`, `input_tokens`,
                                            `errors` (JSON), `output_file_id`, `error_file_id`; TTL BATCH_TTL
    embedfleet:batch:<batch_id>:input  HASH  the input file's hash (meta and parts), COPYed at create (the
                                            file may be deleted meanwhile); TTL BATCH_TTL, deleted once the
                                            batch ends
    embedfleet:batch:<batch_id>:lines  HASH  line index -> its output or error line (JSON), written once
                                            (HSETNX) and counted once as it is collected; TTL the batch's,
                                            deleted once the output files are written
    embedfleet:batch:<batch_id>:lease  STRING  the token of the gateway replica driving the batch; TTL the
                                            replica's --batch-lease-seconds, renewed every third of it: a
                                            replica that dies frees its batches within a lease
    embedfleet:batches              ZSET    batch id -> created_at (ms): GET /v1/batches; pruned like files
                                            (by listings, and past BATCH_TTL by the next create)
    embedfleet:batches:active       ZSET    batch id -> created_at (ms) of every batch not yet ended: what
                                            the replicas' runners claim; a member leaves when its batch ends
    A line of a batch runs as request `<batch_id>-<line index>` (batch_line_request_id): the id is known
    before the submit, so a replica that takes a batch over submits again with the same id and the enqueue
    script refuses an id already in use: no line runs twice, none is lost.
    On a Redis Cluster a file's and a batch's keys carry their id as a hash tag of their own (own_tag:
    embedfleet:file:{<file_id>}, embedfleet:batch:{<batch_id>}:lines, ...): each object is one slot, the
    indexes (embedfleet:files, embedfleet:batches, embedfleet:batches:active) are written apart from it, a
    batch's input is copied part by part rather than COPYed, and a line's request id starts with its model's
    hash tag (`{tag}<batch_id>-<line index>`: the model's queue slot). A plain Redis's layout is as above.

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
    rq:job:<id>                     HASH    the rq job; `data` = zlib(msgpack([func, None, [request
                                            bytes], {}])); job id = request id. Ours besides rq's fields:
                                            `deliveries` (times a worker took it), `lapses` (times its
                                            worker died holding it: past MAX_DELIVERIES it is poison),
                                            `tokens` (the producer's estimate, common.scheduling),
                                            `reply_to` (its producer's reply stream, also inside `data`:
                                            here it is read even when `data` is not), `options` (the gateway
                                            saved answer options for it). TTL JOB_KEY_TTL while queued and
                                            (--rq-records lean) while started, none while started (full);
                                            once answered: deleted (lean, a served job: its answer is the
                                            result blob) or the result's TTL (full; and a failed job's
                                            FAILURE_TTL in both)
    embedfleet:queued_tokens:<queue>  STRING  estimated tokens of the jobs in rq:queue:<queue>: INCRBY by the
                                            producer in the enqueue script, DECRBY by take (and by cancel),
                                            INCRBY by recover / give back; deleted whenever take finds the
                                            queue empty (which heals drift), or the counter holds no whole
                                            number. No TTL: one per queue, like the queue itself
    rq:wip:<queue>                  ZSET    rq's started registry: member <id>:<execution>, score = the
                                            claim's lease end + LEASE_GRACE (Redis server clock); a member
                                            is over 64 bytes (the execution id is hex, 32 or more
                                            characters), which keeps the zset a skiplist (take.lua)
    rq:execution:<id>:<execution>   HASH    rq's record of one run of a job (take writes, finish and recover
                                            delete it), TTL the lease + grace; --rq-records full only
    rq:executions:<id>              ZSET    a job's runs (rq's Execution registry), TTL the lease + grace + 60;
                                            full only
    rq:results:<id>                 STREAM  rq's result record of a FAILED job (exc_string); a served job has
                                            none (its answer is the result blob), TTL FAILURE_TTL
    rq:finished:<queue>             ZSET    rq's finished registry (score: when the entry expires); full only
    rq:failed:<queue>               ZSET    rq's failed registry (score: when the entry expires)
    rq:canceled:<queue>             ZSET    rq's cancelled registry (score: when cancelled); entries older than
                                            CANCELED_TTL are dropped by take and cancel (rq never cleans it)
    rq:worker:<name>, rq:workers, rq:workers:<queue>  HASH/SET  rq worker registration (rq's own; its
                                            `state`, and finish's failed_job_count; full also the take's busy
                                            state, successful_job_count and total_working_time)
    rq:worker:<name>:executions     SET     the executions a worker holds (take adds, finish removes); full only
    rq:suspended                    STRING  set by `rq suspend`: take takes nothing while it exists
    rq:clean_registries:<queue>, rq:clean_groups  STRING  rq's own maintenance locks (short TTL)

Redis Cluster (a redis+cluster:// URL, common/redisclient.py). Every script and every MULTI must touch keys of
one hash slot, so there a model's keys carry its hash tag, `{<10 hex of sha1(model)>}` (slot_tag), in front:
its queue names ({t}embedfleet.<model>, {t}embedfleet.<model>@bulk: rq:queue:{t}embedfleet.<model>, its
registries, its queued_tokens), its request ids ({t}<32 hex>: rq:job:, embedfleet:result:, notify:,
job:, chunks:, rq:execution(s):, rq:results: of the id, and a spread request's parts <id>-p<k>), its
workers' names ({t}<name>: rq:worker:<name>, rq:worker:<name>:executions), an AsyncProducer's reply
stream and kick list (one per tag: embedfleet:replies:{t}<hex>), in-flight markers (embedfleet:inflight:{t}
<digest>) and rq:suspended's stand-in rq:suspended:{t}. A model's traffic is one slot, so one master. The
shared keys (rq:queues, embedfleet:models, adverts, the webhook stream and list) are written outside the
scripts there (a webhook job's answer wakes no stream: the sweeps deliver it). On a plain Redis nothing
carries a tag: the layout above is unchanged. docs/capacity.md#redis-cluster has the whole picture.

Leases. A worker's claim on a job it took lasts LEASE_SECONDS and its heartbeat renews it every third of
that (also during a long forward pass: the heartbeat is a thread of its own). When a claim lapses (the
worker was killed, OOM-killed, lost its host or froze) a live worker of the model requeues the job at the
queue's head at its next beat (common/protocol/operations.py `recover`, atomic, exactly once): a dead worker's jobs
are back within 4/3 of LEASE_SECONDS of its death (8 s by default). rq's own StartedJobRegistry.cleanup
compares the same scores with its clock, so it sees a lapsed claim LEASE_GRACE seconds later: a backstop
that never requeues a job twice.
"""

from __future__ import annotations

import hashlib
import re
import uuid

PREFIX = "embedfleet"

RESULT_TTL = 3600  # seconds a result blob (and its notify list) is kept
RESULT_TTL_BOUND = 7 * 24 * 3600  # a job's own result_ttl above this (or unreadable) gives way to the worker's
JOB_TTL = 24 * 3600  # seconds a job may wait in the queue before rq drops it (rq's `ttl` field)
FAILURE_TTL = 24 * 3600  # seconds a failed rq job stays in the failed registry (rq's default: forever)
JOB_TIMEOUT = 600  # seconds a job may run: past it its lease is no longer renewed, so it lapses and the job
#                    is requeued (a lapse counted toward poison); the watchdog catches a hung pass sooner
JOB_RETRIES = 2  # a job whose worker died is requeued this often (at-least-once), then failed
MAINTENANCE_INTERVAL = 60  # seconds between a worker's rq maintenance runs (the backstop behind leases)
ADVERTISE_TTL = 30  # a worker that stops refreshing stops counting as alive after this long
HEARTBEAT_INTERVAL = 10
LEASE_SECONDS = 6.0  # default --lease-seconds: a claim's life without a renewal (renewed every third)
LEASE_GRACE = 60  # seconds a lapsed claim stays invisible to rq's own cleanup (layout, not policy)
MAX_LEASE_SECONDS = 600  # the longest --lease-seconds
# A queued job key's TTL: JOB_TTL, and the longest a claim on it may last past that (its timeout, a lease,
# the grace), so that a job taken at the end of its wait keeps its hash while it runs (a lean take leaves the
# TTL in place: no PERSIST) and a requeued one gets it again (recover, give back)
JOB_KEY_TTL = JOB_TTL + JOB_TIMEOUT + MAX_LEASE_SECONDS + LEASE_GRACE
RECOVER_LIMIT = 1000  # lapsed claims one recover run requeues (the rest on the next run)
MAX_DELIVERIES = 3  # default --max-deliveries: a job whose worker died this often is failed as poison
DRAIN_TIMEOUT = 30.0  # default --drain-timeout

CACHE_TTL = 24 * 3600  # default --cache-ttl: seconds a cached vector lives (the bound on the queue's Redis)
INFLIGHT_TTL = 60  # seconds an in-flight marker outlives its last renewal (a dead leader's followers wait
#                    at most this long, then run on their own)

# The rq job's function name, which producers write and the batch worker runs in bulk: a name on the wire, kept
# as 0.1 wrote it (before its module moved to embedfleet.worker.jobs), so that producers and workers of either
# version serve each other whichever is upgraded first. A worker takes the module's own name too.
JOB_FUNC = "worker.jobs.embed"
JOB_FUNCS = (JOB_FUNC, "embedfleet.worker.jobs.embed")


# A request id is also an rq job id and part of several key names: rq allows [A-Za-z0-9_-]+, and ours
# (uuid4 hex) are 32 characters long. Anything else read from Redis or a URL is not one of our ids.
MAX_REQUEST_ID_LENGTH = 64
MAX_TAG_LENGTH = 16  # a hash tag's characters between its braces (Redis Cluster, slot_tag)
_TAG = rf"\{{[A-Za-z0-9_-]{{1,{MAX_TAG_LENGTH}}}\}}"
_ID_CHARS = rf"(?:{_TAG})?[A-Za-z0-9_-]{{1,{MAX_REQUEST_ID_LENGTH}}}"
_REQUEST_ID = re.compile(_ID_CHARS)
_REPLY_STREAM = re.compile(re.escape(f"{PREFIX}:replies:") + _ID_CHARS)


def valid_request_id(request_id: str | bytes) -> bool:
    """True if `request_id` (text, or bytes as read from Redis) can be an embedfleet request id."""
    if isinstance(request_id, bytes):
        return _REQUEST_ID.fullmatch(request_id.decode("ascii", "replace")) is not None
    return isinstance(request_id, str) and _REQUEST_ID.fullmatch(request_id) is not None


def is_reply_stream_key(key: str | bytes) -> bool:
    """True if `key` lies in the reply-stream key space (reply_stream_key): the only keys a request's
    `reply_to` may name, so that a worker never writes to a key it was merely told about."""
    if isinstance(key, bytes):
        key = key.decode("ascii", "replace")
    return isinstance(key, str) and _REPLY_STREAM.fullmatch(key) is not None


PRIORITIES = ("interactive", "bulk")  # a model's priority levels, highest first (issue #10)


def queue_name(model: str, priority: str = "interactive", tag: str = "") -> str:
    """The rq queue of `model` at `priority`; the interactive level keeps the name queues always had.
    `tag`: the model's hash tag on a Redis Cluster (slot_tag), '' on a plain Redis."""
    if priority not in PRIORITIES:
        raise ValueError(f"unknown priority {priority!r}: one of {', '.join(PRIORITIES)}")
    return tag + (f"{PREFIX}.{model}" if priority == "interactive" else f"{PREFIX}.{model}@{priority}")


# -- Redis Cluster: hash tags (see the module docstring) -------------------------------------------------

_LEADING_TAG = re.compile(_TAG)


def slot_tag(model: str, partition: str = "") -> str:
    """The hash tag of `model`'s keys on a Redis Cluster: the same for every producer and worker. A model
    given several partitions on one cluster (URLs that differ in their #partition) has a tag per partition."""
    name = f"{model}#{partition}" if partition else model
    return "{" + hashlib.sha1(name.encode()).hexdigest()[:10] + "}"


def tag_of(name: str) -> str:
    """The hash tag a queue name, request id or worker name starts with, or ''."""
    found = _LEADING_TAG.match(name)
    return found.group(0) if found else ""


def untagged(name: str) -> str:
    """`name` without its leading hash tag (a queue name as a plain Redis has it)."""
    return name[len(tag_of(name)):]


def tagged_request_id(tag: str) -> str:
    """A new request id in `tag`'s slot (common.request.new_request_id's form after the tag)."""
    return tag + uuid.uuid4().hex


def rq_suspended_key(tag: str = "") -> str:
    """rq:suspended, which take reads; on a Redis Cluster a stand-in in the model's slot (`rq suspend` on a
    cluster does not reach it)."""
    return f"{RQ_SUSPENDED}:{tag}" if tag else RQ_SUSPENDED


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


# OpenAI's Batch API (producer/gateway/batches/)
FILES_KEY = f"{PREFIX}:files"
BATCHES_KEY = f"{PREFIX}:batches"
ACTIVE_BATCHES_KEY = f"{PREFIX}:batches:active"
FILE_TTL = 30 * 24 * 3600  # a file without `expires_after` lives 30 days (OpenAI's default for batch files)
FILE_TTL_MIN, FILE_TTL_MAX = 3600, 30 * 24 * 3600  # the range OpenAI allows for `expires_after.seconds`
BATCH_TTL = 30 * 24 * 3600  # a batch object (and its work keys while it runs) is kept 30 days
BATCH_LEASE = 10.0  # default --batch-lease-seconds: a replica's claim on a batch without a renewal
MAX_BATCH_LINES = 50_000  # OpenAI's limit of requests per batch file
FILE_UPLOAD_TTL = 3600  # a file being written, part by part, that is never completed goes after this


def own_tag(object_id: str, tagged: bool) -> str:
    """A file's or batch's id as its keys hold it: on a Redis Cluster (`tagged`) inside {} (a hash tag of its
    own, so all the object's keys are one slot); on a plain Redis as it is."""
    return "{" + object_id + "}" if tagged else object_id


def file_key(file_id: str, tagged: bool = False) -> str:
    return f"{PREFIX}:file:{own_tag(file_id, tagged)}"


def file_upload_key(file_id: str, tagged: bool = False) -> str:
    return f"{PREFIX}:file:{own_tag(file_id, tagged)}:upload"


def file_part_field(index: int) -> str:
    """The field of a file's hash holding part `index` (0-based) of its bytes."""
    return f"part:{index}"


def batch_key(batch_id: str, tagged: bool = False) -> str:
    return f"{PREFIX}:batch:{own_tag(batch_id, tagged)}"


def batch_input_key(batch_id: str, tagged: bool = False) -> str:
    return f"{PREFIX}:batch:{own_tag(batch_id, tagged)}:input"


def batch_lines_key(batch_id: str, tagged: bool = False) -> str:
    return f"{PREFIX}:batch:{own_tag(batch_id, tagged)}:lines"


def batch_lease_key(batch_id: str, tagged: bool = False) -> str:
    return f"{PREFIX}:batch:{own_tag(batch_id, tagged)}:lease"


def batch_line_request_id(batch_id: str, index: int) -> str:
    """The request id line `index` (0-based) of a batch runs as: fixed before its submit (see above)."""
    return f"{batch_id}-{index}"


# rq's keys (rq 3.0's layout; RQ_KEY_PREFIX is not supported: rq's own default, "rq")
RQ_JOB_PREFIX = "rq:job:"
RQ_EXECUTION_PREFIX = "rq:execution:"  # + <id>:<execution>
RQ_EXECUTIONS_PREFIX = "rq:executions:"  # + <id>
RQ_RESULTS_PREFIX = "rq:results:"  # + <id>
RQ_WORKER_PREFIX = "rq:worker:"  # + <worker name>
RQ_QUEUES = "rq:queues"
RQ_SUSPENDED = "rq:suspended"
CANCELED_TTL = FAILURE_TTL  # seconds a cancelled id stays in rq:canceled:<queue> (rq itself never cleans it)


def rq_job_key(request_id: str) -> str:
    return RQ_JOB_PREFIX + request_id


def rq_queue_key(queue: str) -> str:
    return f"rq:queue:{queue}"


def rq_wip_key(queue: str) -> str:
    """rq's started registry of `queue`."""
    return f"rq:wip:{queue}"


def rq_finished_key(queue: str) -> str:
    return f"rq:finished:{queue}"


def rq_failed_key(queue: str) -> str:
    return f"rq:failed:{queue}"


def rq_canceled_key(queue: str) -> str:
    return f"rq:canceled:{queue}"


def rq_worker_key(worker_name: str) -> str:
    return RQ_WORKER_PREFIX + worker_name


def rq_worker_executions_key(worker_name: str) -> str:
    return f"{RQ_WORKER_PREFIX}{worker_name}:executions"
