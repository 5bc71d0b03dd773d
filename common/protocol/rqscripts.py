"""The Lua scripts of rq 3.0's per-job schema (common/protocol/rqschema.py runs them): each header lists every key
it touches, its arguments and its answer. Loaded once per server and run by SHA (EVALSHA)."""

from __future__ import annotations

import hashlib

import redis
from redis import Redis

_LIB = """
local function num(value, default)
  local n = tonumber(value)
  if n == nil or n ~= n then return default end
  return n
end
local function is_type(key, wanted)
  local t = redis.call('TYPE', key)['ok']
  return t == wanted or t == 'none'
end
-- redis.pcall's answer for a command refused (e.g. WRONGTYPE: a key of a foreign type)
local function refused(reply)
  return type(reply) == 'table' and reply['err'] ~= nil
end
-- the server's clock: leases are compared on one clock, whatever the workers' clocks say
local function server_time()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end
-- a requeued job's estimated tokens back on its queue's counter (see TAKE); a corrupt counter is reset
local function requeue_tokens(counter, jobkey)
  local n = redis.pcall('HGET', jobkey, 'tokens')
  n = refused(n) and 0 or math.max(0, math.floor(num(n, 0)))
  if n > 0 and refused(redis.pcall('INCRBY', counter, n)) then redis.call('DEL', counter) end
end
-- one multi-member command per batch (in chunks, within Lua's unpack limit): `args` after the key
local function bulk(command, key, args)
  for i = 1, #args, 4000 do
    redis.call(command, key, unpack(args, i, math.min(i + 3999, #args)))
  end
end
"""

TAKE = _LIB + """
-- take: move up to ARGV[1] job ids from a model's queues (its priority levels, in the order given: the
-- first is emptied before the next is read) straight into each queue's started registry, as rq's
-- prepare_execution + prepare_job_execution write them, in one atomic step (no intermediate list).
-- KEYS[1] rq:worker:<name>        HASH  HSET state, last_heartbeat
-- KEYS[2] rq:worker:<name>:executions SET SADD <id>:<execution>, EXPIRE
-- KEYS[3] rq:suspended            STRING EXISTS (set: take nothing)
-- then per queue, 4 keys:
--   rq:queue:<q>                  LIST  LPOP, LLEN
--   rq:wip:<q>                    ZSET  ZADD <id>:<execution> (score: the lease, below)
--   rq:canceled:<q>               ZSET  ZADD (a job cancelled while it was queued)
--   embedfleet:queued_tokens:<q>  STRING DECRBY each taken job's `tokens`; DEL when the queue is empty
-- per id: rq:job:<id> HASH (HMGET, HSET status/started_at/last_heartbeat/worker_name, HINCRBY deliveries,
--         PERSIST; a key of another type counts as missing),
--         rq:execution:<id>:<execution> HASH (HSET, EXPIRE), rq:executions:<id> ZSET (ZADD, EXPIRE)
-- ARGV: 1 max ids, 2 worker name, 3 now (unix s), 4 now (rq time), 5 execution id prefix,
--       6 max id length, 7 default job timeout, 8 lease (s), 9 lease grace (s)
-- The lease: score = the server's clock (TIME) + lease + grace; job field `deliveries` += 1.
-- Returns {suspended, {queue, id, kind, execution, data, timeout, result_ttl, failure_ttl, deliveries,
--          lapses}...}; queue: the queue's position in KEYS (1 = the first)
-- kind: started | canceled | missing (no hash: dropped, as rq drops it) | badid | stale (already ended)
if redis.call('EXISTS', KEYS[3]) == 1 then return {1, {}} end
local now, iso, worker = tonumber(ARGV[3]), ARGV[4], ARGV[2]
local wanted, maxlen, default_timeout = tonumber(ARGV[1]), tonumber(ARGV[6]), tonumber(ARGV[7])
local lease, grace = tonumber(ARGV[8]), tonumber(ARGV[9])
local clock = server_time()
local ttl = math.ceil(lease + grace)
local out, longest, members, n = {}, 0, {}, 0
for q = 1, (#KEYS - 3) / 4 do
  local base = 3 + (q - 1) * 4
  local qkey, wip, canceled, tokens = KEYS[base + 1], KEYS[base + 2], KEYS[base + 3], KEYS[base + 4]
  local ids = false
  if wanted > 0 then ids = redis.call('LPOP', qkey, wanted) end
  local started, taken_tokens = {}, 0
  for _, id in ipairs(ids or {}) do
    n = n + 1
    wanted = wanted - 1
    if #id > maxlen or not string.match(id, '^[%w_%-]+$') then
      out[#out + 1] = {q, id, 'badid'}
    else
      local jobkey = 'rq:job:' .. id
      local f = redis.pcall('HMGET', jobkey, 'data', 'status', 'timeout', 'result_ttl', 'failure_ttl', 'lapses',
                            'tokens')
      if refused(f) or not f[1] then
        out[#out + 1] = {q, id, 'missing'}
      else
        taken_tokens = taken_tokens + math.max(0, math.floor(num(f[7], 0)))
        if f[2] == 'canceled' then
          redis.call('ZADD', canceled, now, id)
          out[#out + 1] = {q, id, 'canceled', '', f[1]}
        elseif f[2] == 'finished' or f[2] == 'failed' then
          out[#out + 1] = {q, id, 'stale'}
        else
          local timeout = num(f[3], default_timeout)
          longest = ttl
          local execution = ARGV[5] .. n
          local member = id .. ':' .. execution
          local exkey = 'rq:execution:' .. member
          redis.call('HSET', exkey, 'id', execution, 'job_id', id, 'created_at', ARGV[3],
                     'last_heartbeat', ARGV[3], 'worker_name', worker)
          redis.call('EXPIRE', exkey, ttl)
          redis.call('ZADD', 'rq:executions:' .. id, now + ttl + 60, execution)
          redis.call('EXPIRE', 'rq:executions:' .. id, ttl + 60)
          started[#started + 1] = clock + lease + grace
          started[#started + 1] = member
          members[#members + 1] = member
          redis.call('HSET', jobkey, 'last_heartbeat', iso, 'status', 'started', 'started_at', iso,
                     'worker_name', worker)
          local deliveries = redis.call('HINCRBY', jobkey, 'deliveries', 1)
          redis.call('PERSIST', jobkey)
          out[#out + 1] = {q, id, 'started', execution, f[1], tostring(timeout), f[4] or '', f[5] or '',
                           deliveries, math.floor(num(f[6], 0))}
        end
      end
    end
  end
  if #started > 0 then bulk('ZADD', wip, started) end
  -- the counter is an estimate kept by producers (INCRBY) and takers (DECRBY); an empty queue has none,
  -- which also heals any drift (jobs that expired in the queue, a producer that died mid-way)
  if redis.call('LLEN', qkey) == 0 then
    redis.call('DEL', tokens)
  elseif taken_tokens > 0 then
    local left = redis.pcall('DECRBY', tokens, taken_tokens)
    if refused(left) or left < 0 then redis.call('DEL', tokens) end
  end
end
if longest > 0 then
  bulk('SADD', KEYS[2], members)
  redis.call('EXPIRE', KEYS[2], longest + 60)
  redis.call('HSET', KEYS[1], 'state', 'busy', 'last_heartbeat', iso)
end
return {0, out}
"""

FINISH = _LIB + """
-- finish: answer each job and end its rq execution, only while this worker's claim stands.
-- KEYS[1] rq:queue:<q>            LIST  RPUSH / LPUSH (a retry)
-- KEYS[2] rq:wip:<q>              ZSET  ZSCORE (the claim), ZREM
-- KEYS[3] rq:finished:<q>         ZSET  ZADD
-- KEYS[4] rq:failed:<q>           ZSET  ZADD
-- KEYS[5] rq:canceled:<q>         ZSET  (untouched here: take registered it)
-- KEYS[6] rq:worker:<name>        HASH  HINCRBY successful_job_count / failed_job_count, total_working_time
-- KEYS[7] rq:worker:<name>:executions SET SREM
-- per id: rq:job:<id> HASH (HSET status/ended_at/exc_info/retries_left, EXPIRE), rq:results:<id> STREAM
--         (XADD, EXPIRE), rq:execution:<id>:<execution> (DEL), rq:executions:<id> ZSET (ZREM),
--         <result prefix><id> STRING (SET EX), <notify prefix><id> LIST (RPUSH, EXPIRE),
--         the request's reply stream (XADD MAXLEN ~, EXPIRE) when it is one of ours
-- ARGV: 1 worker name, 2 now (unix s), 3 now (rq time), 4 working seconds, 5 result blob ttl,
--       6 result prefix, 7 notify prefix, 8 reply stream maxlen, then per job 10 values:
--       id, execution, outcome (finished|failed|retry|canceled), blob, reply_to, rq payload
--       (finished: base64 return value; failed: base64 zlib exc_string), exc_info (zlib), rq ttl, nx,
--       execution start (unix s)
-- Returns {finished, failed, requeued, late}; late: answered, but the claim had lapsed (rq left as is).
local worker, now, iso = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local blob_ttl, rprefix, nprefix, maxlen = tonumber(ARGV[5]), ARGV[6], ARGV[7], ARGV[8]
local ok, bad, requeued, late = 0, 0, 0, 0
local ended, finished, failed = {}, {}, {}

-- a key of a foreign type is never written to (pcall), nor given a TTL
local function publish(id, blob, reply_to, nx)
  if blob == '' then return end
  if nx == '1' then
    redis.call('SET', rprefix .. id, blob, 'EX', blob_ttl, 'NX')
  else
    redis.call('SET', rprefix .. id, blob, 'EX', blob_ttl)
  end
  local nkey = nprefix .. id
  if not refused(redis.pcall('RPUSH', nkey, 1)) then redis.call('EXPIRE', nkey, blob_ttl) end
  if reply_to ~= '' and not refused(redis.pcall('XADD', reply_to, 'MAXLEN', '~', maxlen, '*', 'id', id)) then
    redis.call('EXPIRE', reply_to, blob_ttl)
  end
end

local function rq_result(id, kind, field, payload, execution, started, ttl)
  local rkey = 'rq:results:' .. id
  local added = redis.pcall('XADD', rkey, 'MAXLEN', '~', 10, '*', 'type', kind, 'worker_name', worker, field,
                            payload, 'execution_id', execution, 'execution_started_at', started,
                            'execution_ended_at', ARGV[2])
  if not refused(added) then redis.call('EXPIRE', rkey, ttl) end
end

local function end_execution(id, execution)
  local member = id .. ':' .. execution
  redis.call('DEL', 'rq:execution:' .. member)
  redis.pcall('ZREM', 'rq:executions:' .. id, execution)
  ended[#ended + 1] = member
end

for i = 9, #ARGV, 10 do
  local id, execution, outcome, blob = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local reply_to, payload, exc_info, ttl = ARGV[i + 4], ARGV[i + 5], ARGV[i + 6], tonumber(ARGV[i + 7])
  local nx, started = ARGV[i + 8], ARGV[i + 9]
  local jobkey = 'rq:job:' .. id
  local claimed = execution ~= '' and redis.call('ZSCORE', KEYS[2], id .. ':' .. execution) ~= false
  if outcome == 'canceled' then
    publish(id, blob, reply_to, nx)
  elseif not claimed then
    -- rq's maintenance took the job back (this worker looked dead): the answer is still valid
    if outcome == 'finished' then publish(id, blob, reply_to, nx) end
    late = late + 1
  elseif outcome == 'finished' then
    rq_result(id, '1', 'return_value', payload, execution, started, ttl)
    end_execution(id, execution)
    redis.pcall('HSET', jobkey, 'status', 'finished', 'ended_at', iso)
    redis.call('EXPIRE', jobkey, ttl)
    finished[#finished + 1] = now + ttl
    finished[#finished + 1] = id
    publish(id, blob, reply_to, nx)
    ok = ok + 1
  else
    local left = redis.pcall('HGET', jobkey, 'retries_left')
    left = num(refused(left) and 0 or left, 0)
    bad = bad + 1
    end_execution(id, execution)
    if outcome == 'retry' and left > 0 then
      redis.call('HSET', jobkey, 'status', 'queued', 'retries_left', left - 1, 'enqueued_at', iso)
      if redis.call('HGET', jobkey, 'enqueue_at_front_on_retry') == '1' then
        redis.call('LPUSH', KEYS[1], id)
      else
        redis.call('RPUSH', KEYS[1], id)
      end
      requeued = requeued + 1
    else
      rq_result(id, '2', 'exc_string', payload, execution, started, ttl)
      redis.pcall('HSET', jobkey, 'status', 'failed', 'ended_at', iso, 'exc_info', exc_info)
      redis.call('EXPIRE', jobkey, ttl)
      failed[#failed + 1] = now + ttl
      failed[#failed + 1] = id
      publish(id, blob, reply_to, nx)
    end
  end
end
if #ended > 0 then
  bulk('ZREM', KEYS[2], ended)
  bulk('SREM', KEYS[7], ended)
end
if #finished > 0 then bulk('ZADD', KEYS[3], finished) end
if #failed > 0 then bulk('ZADD', KEYS[4], failed) end
if ok > 0 then redis.call('HINCRBY', KEYS[6], 'successful_job_count', ok) end
if bad > 0 then redis.call('HINCRBY', KEYS[6], 'failed_job_count', bad) end
redis.call('HINCRBYFLOAT', KEYS[6], 'total_working_time', ARGV[4])
return {ok, bad - requeued, requeued, late}
"""

REFRESH = _LIB + """
-- refresh: renew a held batch's leases (rq's maintain_heartbeats, for many jobs at once); never recreates
-- an entry that finish, recover (the lease had lapsed) or rq's maintenance already removed.
-- KEYS[1] rq:wip:<q>  ZSET  ZSCORE, ZADD XX
-- per id: rq:execution:<id>:<execution> HASH (HSET last_heartbeat, EXPIRE), rq:job:<id> HASH (HSET
--         last_heartbeat)
-- ARGV: 1 now (unix s), 2 now (rq time), 3 lease grace (s), then per job: id, execution, lease (s)
-- Returns the number of claims renewed.
local clock, grace, refreshed = server_time(), tonumber(ARGV[3]), 0
for i = 4, #ARGV, 3 do
  local id, execution, lease = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  local member = id .. ':' .. execution
  if redis.call('ZSCORE', KEYS[1], member) then
    redis.call('ZADD', KEYS[1], 'XX', clock + lease + grace, member)
    local exkey = 'rq:execution:' .. member
    if redis.call('EXISTS', exkey) == 1 then
      redis.call('HSET', exkey, 'last_heartbeat', ARGV[1])
      redis.call('EXPIRE', exkey, math.ceil(lease + grace))
    end
    if is_type('rq:job:' .. id, 'hash') then redis.call('HSET', 'rq:job:' .. id, 'last_heartbeat', ARGV[2]) end
    refreshed = refreshed + 1
  end
end
return refreshed
"""

RECOVER = _LIB + """
-- recover: requeue the jobs whose lease lapsed (their worker died or froze), at the head of the queue, each
-- exactly once: the script is atomic, and a claim is requeued only by the run that removes it. Cheap: one
-- ZRANGEBYSCORE with LIMIT from the low end of the registry (lapsed claims sort first), never a scan.
-- KEYS[1] rq:queue:<q>            LIST  LPUSH
-- KEYS[2] rq:wip:<q>              ZSET  ZRANGEBYSCORE LIMIT, ZREM
-- KEYS[3] embedfleet:queued_tokens:<q> STRING INCRBY the requeued job's `tokens`
-- per claim: rq:execution:<id>:<execution> HASH (HGET worker_name, DEL), rq:executions:<id> ZSET (ZREM),
--            rq:worker:<dead worker>:executions SET (SREM),
--            rq:job:<id> HASH (HGET status; when started: HSET status/enqueued_at, HINCRBY lapses)
-- ARGV: 1 lease grace (s), 2 most claims per run, 3 now (rq time)
-- Returns {{id, seconds past the lease's end, worker name}...}: the requeued jobs. A claim whose job is no
-- longer started (cancelled, answered late, or gone) is only removed.
local clock, grace = server_time(), tonumber(ARGV[1])
local lapsed = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', '(' .. (clock + grace), 'WITHSCORES', 'LIMIT', 0,
                          tonumber(ARGV[2]))
local out, requeue = {}, {}
for i = 1, #lapsed, 2 do
  local member, score = lapsed[i], tonumber(lapsed[i + 1])
  if redis.call('ZREM', KEYS[2], member) == 1 then
    local id, execution = string.match(member, '^(.*):([^:]*)$')
    if id then
      local exkey = 'rq:execution:' .. member
      local owner = redis.pcall('HGET', exkey, 'worker_name')
      if refused(owner) or not owner then owner = '' end
      redis.call('DEL', exkey)
      redis.pcall('ZREM', 'rq:executions:' .. id, execution)
      if owner ~= '' then redis.pcall('SREM', 'rq:worker:' .. owner .. ':executions', member) end
      local jobkey = 'rq:job:' .. id
      local status = redis.pcall('HGET', jobkey, 'status')
      if status == 'started' then
        redis.call('HSET', jobkey, 'status', 'queued', 'enqueued_at', ARGV[3])
        redis.call('HINCRBY', jobkey, 'lapses', 1)
        requeue_tokens(KEYS[3], jobkey)
        requeue[#requeue + 1] = id
        out[#out + 1] = {id, tostring(clock - (score - grace)), owner}
      end
    end
  end
end
-- LPUSH puts each id at the head: push the latest-lapsed first so the oldest is served first
for i = #requeue, 1, -1 do redis.call('LPUSH', KEYS[1], requeue[i]) end
return out
"""

RETURN = _LIB + """
-- return: a draining worker gives back the jobs it took but has not started on the device: its claims are
-- removed and the ids go back to the head of the queue, in their order, as if never taken (the delivery
-- is not counted).
-- KEYS[1] rq:queue:<q>            LIST  LPUSH
-- KEYS[2] rq:wip:<q>              ZSET  ZREM
-- KEYS[3] rq:worker:<name>:executions SET SREM
-- KEYS[4] embedfleet:queued_tokens:<q> STRING INCRBY the returned job's `tokens`
-- per id: rq:execution:<id>:<execution> HASH (DEL), rq:executions:<id> ZSET (ZREM), rq:job:<id> HASH
--         (HSET status/enqueued_at, HINCRBY deliveries -1; only when it is still started)
-- ARGV: 1 now (rq time), then per job: id, execution
-- Returns the number of jobs returned (a claim that had lapsed was requeued by recover instead).
local back = {}
for i = 2, #ARGV, 2 do
  local id, execution = ARGV[i], ARGV[i + 1]
  local member = id .. ':' .. execution
  if redis.call('ZREM', KEYS[2], member) == 1 then
    redis.call('SREM', KEYS[3], member)
    redis.call('DEL', 'rq:execution:' .. member)
    redis.pcall('ZREM', 'rq:executions:' .. id, execution)
    local jobkey = 'rq:job:' .. id
    if redis.pcall('HGET', jobkey, 'status') == 'started' then
      redis.call('HSET', jobkey, 'status', 'queued', 'enqueued_at', ARGV[1])
      redis.call('HINCRBY', jobkey, 'deliveries', -1)
      requeue_tokens(KEYS[4], jobkey)
      back[#back + 1] = id
    end
  end
end
for i = #back, 1, -1 do redis.call('LPUSH', KEYS[1], back[i]) end
return #back
"""


class Script:
    """A Lua script run by its SHA (EVALSHA); loaded again when the server has lost it (a restart)."""

    def __init__(self, source: str):
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()

    def __call__(self, connection: Redis, keys_: list[str], args: list) -> object:
        try:
            return connection.evalsha(self.sha, len(keys_), *keys_, *args)
        except redis.exceptions.NoScriptError:
            connection.script_load(self.source)
            return connection.evalsha(self.sha, len(keys_), *keys_, *args)

    def queue(self, pipe, keys_: list[str], args: list) -> None:
        """Queue on a pipeline; the caller retries the whole pipeline after `load` on NoScriptError."""
        pipe.evalsha(self.sha, len(keys_), *keys_, *args)

    def load(self, connection: Redis) -> None:
        connection.script_load(self.source)


TAKE_SCRIPT, FINISH_SCRIPT, REFRESH_SCRIPT = Script(TAKE), Script(FINISH), Script(REFRESH)
RECOVER_SCRIPT, RETURN_SCRIPT = Script(RECOVER), Script(RETURN)
