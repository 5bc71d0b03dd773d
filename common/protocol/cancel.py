"""Cancelling a pending request: one Lua script, so a cancel is all-or-nothing against the workers.

Only a request still in its queue list can be cancelled; LREM is the claim (a worker moves ids out of that
list atomically), and the same script writes what rq's Job.cancel() writes and what a waiter needs.
"""

from __future__ import annotations

import time

from redis import Redis
from rq import Queue
from rq.job import Job, JobStatus

from common.protocol import keys
from common.result import Result

# KEYS: queue list, job hash, canceled registry, result key, notify list, job options, queued tokens
#       counter[, reply stream]
# ARGV: request id, now, result blob, ttl, reply stream max length
_CANCEL = """
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 0 then return 0 end
redis.call('HSET', KEYS[2], 'status', '""" + JobStatus.CANCELED.value + """')
redis.call('ZADD', KEYS[3], ARGV[2], ARGV[1])
redis.call('SET', KEYS[4], ARGV[3], 'EX', ARGV[4])
redis.call('RPUSH', KEYS[5], 1)
redis.call('EXPIRE', KEYS[5], ARGV[4])
redis.call('EXPIRE', KEYS[6], ARGV[4])
local tokens = tonumber(redis.call('HGET', KEYS[2], 'tokens'))
if tokens and tokens > 0 then
  local left = redis.pcall('DECRBY', KEYS[7], math.floor(tokens))
  if type(left) ~= 'number' or left < 0 then redis.call('DEL', KEYS[7]) end
end
if KEYS[8] then
  redis.call('XADD', KEYS[8], 'MAXLEN', '~', ARGV[5], '*', 'id', ARGV[1])
  redis.call('EXPIRE', KEYS[8], ARGV[4])
end
return 1
"""


def cancel_pending(connection: Redis, job: Job, queue: Queue, answer: Result, reply_to: str | None) -> bool:
    """True if the job was still queued and is now cancelled, with `answer` published for its waiters."""
    stream = [reply_to] if reply_to else []
    return bool(connection.eval(
        _CANCEL, 7 + len(stream), queue.key, job.key, queue.canceled_job_registry.key,
        keys.result_key(job.id), keys.notify_key(job.id), keys.job_options_key(job.id),
        keys.queued_tokens_key(queue.name), *stream,
        job.id, time.time(), answer.encode(), keys.RESULT_TTL, keys.REPLY_STREAM_MAXLEN))
