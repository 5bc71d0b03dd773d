"""The keys of OpenAI's Batch API (producer/gateway/batches/), on the gateway's own Redis (--redis-url); keys.py
draws the whole layout.

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

A line of a batch runs as request `<batch_id>-<line index>` (batch_line_request_id): the id is known before the
submit, so a replica that takes a batch over submits again with the same id and the enqueue script refuses an id
already in use: no line runs twice, none is lost.

On a Redis Cluster a file's and a batch's keys carry their id as a hash tag of their own (own_tag:
embedfleet:file:{<file_id>}, embedfleet:batch:{<batch_id>}:lines, ...): each object is one slot, the indexes
(embedfleet:files, embedfleet:batches, embedfleet:batches:active) are written apart from it, a batch's input is
copied part by part rather than COPYed, and a line's request id starts with its model's hash tag
(`{tag}<batch_id>-<line index>`: the model's queue slot). A plain Redis's layout is as above.
"""

from __future__ import annotations

from embedfleet.common.protocol.keys import PREFIX

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
