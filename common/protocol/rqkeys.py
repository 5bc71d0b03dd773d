"""rq's own keys as the protocol reads and writes them (rq 3.0's layout; RQ_KEY_PREFIX is not supported: rq's own
default, "rq"). keys.py draws the whole layout; what rq's keys hold of ours:

    rq:job:<id>                     HASH    the rq job; `data` = zlib(msgpack([func, None, [request
                                            bytes], {}])) (jobdata.py); job id = request id. Ours besides rq's
                                            fields: `deliveries` (times a worker took it), `lapses` (times its
                                            worker died holding it: past MAX_DELIVERIES it is poison),
                                            `tokens` (the producer's estimate, common.scheduling),
                                            `reply_to` (its producer's reply stream, also inside `data`:
                                            here it is read even when `data` is not), `options` (the gateway
                                            saved answer options for it). TTL JOB_KEY_TTL while queued and
                                            (--rq-records lean) while started, none while started (full);
                                            once answered: deleted (lean, a served job: its answer is the
                                            result blob) or the result's TTL (full; and a failed job's
                                            FAILURE_TTL in both)
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
    rq:canceled:<queue>             ZSET    rq's cancelled registry (score: when cancelled); entries older than
                                            CANCELED_TTL are dropped by take and cancel (rq never cleans it)
    rq:worker:<name>, rq:workers, rq:workers:<queue>  HASH/SET  rq worker registration (rq's own; its
                                            `state`, and finish's failed_job_count; full also the take's busy
                                            state, successful_job_count and total_working_time)
"""

from __future__ import annotations

from embedfleet.common.policy import FAILURE_TTL, JOB_TIMEOUT, JOB_TTL, MAX_LEASE_SECONDS

RQ_JOB_PREFIX = "rq:job:"
RQ_EXECUTION_PREFIX = "rq:execution:"  # + <id>:<execution>
RQ_EXECUTIONS_PREFIX = "rq:executions:"  # + <id>
RQ_RESULTS_PREFIX = "rq:results:"  # + <id>
RQ_WORKER_PREFIX = "rq:worker:"  # + <worker name>
RQ_QUEUES = "rq:queues"
RQ_SUSPENDED = "rq:suspended"
CANCELED_TTL = FAILURE_TTL  # seconds a cancelled id stays in rq:canceled:<queue> (rq itself never cleans it)
LEASE_GRACE = 60  # seconds a lapsed claim stays invisible to rq's own cleanup (layout, not policy)
# A queued job key's TTL: JOB_TTL, and the longest a claim on it may last past that (its timeout, a lease,
# the grace), so that a job taken at the end of its wait keeps its hash while it runs (a lean take leaves the
# TTL in place: no PERSIST) and a requeued one gets it again (recover, give back)
JOB_KEY_TTL = JOB_TTL + JOB_TIMEOUT + MAX_LEASE_SECONDS + LEASE_GRACE


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


def rq_suspended_key(tag: str = "") -> str:
    """rq:suspended, which take reads; on a Redis Cluster a stand-in in the model's slot (`rq suspend` on a
    cluster does not reach it)."""
    return f"{RQ_SUSPENDED}:{tag}" if tag else RQ_SUSPENDED
