-- take: move up to ARGV[1] job ids from a model's queues (its priority levels, in the order given: a round
-- comes from the first that has any, never from two, so that a round of interactive work carries no bulk
-- work it would wait for) straight into each queue's started registry, as rq's
-- prepare_execution + prepare_job_execution write them, in one atomic step (no intermediate list).
--
-- KEYS[1] rq:worker:<name>             HASH    HSET state, last_heartbeat
-- KEYS[2] rq:worker:<name>:executions  SET     SADD <id>:<execution>, EXPIRE
-- KEYS[3] rq:suspended                 any     EXISTS (set: take nothing)
-- then per queue, 4 keys:
--   rq:queue:<q>                       LIST    LRANGE, LPOP, LLEN
--   rq:wip:<q>                         ZSET    ZADD <id>:<execution> (score: the lease, below)
--   rq:canceled:<q>                    ZSET    ZADD (a job cancelled while queued), ZREMRANGEBYSCORE (bound)
--   embedfleet:queued_tokens:<q>       STRING  DECRBY the taken jobs' `tokens`; DEL when the queue is empty
--                                              or the counter is no whole number
-- per id: rq:job:<id> HASH (HMGET; HSET status/started_at/last_heartbeat/worker_name, HINCRBY deliveries,
--         PERSIST; HSET '' over any callback name), rq:execution:<id>:<execution> HASH (HSET, EXPIRE),
--         rq:executions:<id> ZSET (ZADD, EXPIRE; both through pcall: rq's bookkeeping, kept where it can be)
-- ARGV: 1 max ids, 2 worker name, 3 now (unix s), 4 now (rq time), 5 execution id prefix,
--       6 default job timeout (s), 7 lease (s), 8 lease grace (s), 9 how long a cancelled id stays in
--       rq:canceled:<q> (s), 10 most estimated tokens a round holds (0: no limit; the job that reaches it
--       is still taken: a round is cut by the work its jobs say they hold, at least one job)
-- The lease: score = the server's clock (TIME) + lease + grace; job field `deliveries` += 1.
--
-- Returns {suspended, {{queue, id, kind, execution, data, timeout, result_ttl, failure_ttl, deliveries,
--          lapses, reason, reply_to}...}, {unusable queue positions}}; queue: its position among the queues (1 =
-- the first). kind: started | bad (claimed like started, to be failed with `reason`: a field or key of
-- the job that no producer writes) | canceled | missing (no job hash: dropped, as rq drops it) | badid (no
-- job can have that id) | stale (already ended). A queue whose list or started registry is of the wrong
-- type is left alone and named in the third list.
--
-- Validation first: every id, field and key type is read and judged before the first write, and every
-- write goes to a key whose type was checked, so the script never stops half-way with ids taken off a
-- queue and put nowhere.

local now, iso, worker = number(ARGV[3]), ARGV[4], ARGV[2]
local wanted, default_timeout = integer(ARGV[1]), number(ARGV[6])
local lease, grace, canceled_ttl = number(ARGV[7]), number(ARGV[8]), number(ARGV[9])
local token_limit = integer(ARGV[10] or '0')
if not (now and wanted and default_timeout and lease and grace and canceled_ttl and token_limit) then
  return redis.error_reply('take: bad arguments')
end
if redis.call('EXISTS', KEYS[3]) == 1 then return {1, {}, {}} end
local clock = server_time()
local ttl = math.ceil(lease + grace)
local worker_ok = usable(KEYS[1], 'hash')
local executions_ok = usable(KEYS[2], 'set')

-- 1. read and judge ---------------------------------------------------------------------------------
local FIELDS = {'data', 'status', 'timeout', 'result_ttl', 'failure_ttl', 'lapses', 'tokens', 'deliveries',
                'success_callback_name', 'failure_callback_name', 'stopped_callback_name', 'reply_to'}
local WAITING = {queued = true, started = true, deferred = true, scheduled = true, stopped = true}

-- a TTL field: absent, empty or a whole number (rq writes -1 for "never"); false when it is none of these
local function ttl_field(value)
  if value == false or value == '' then return '' end
  return integer(value) and value or false
end

local function judge(id)
  if not valid_id(id) then return {kind = 'badid'} end
  local jobkey = JOB .. id
  local f = redis.pcall('HMGET', jobkey, unpack(FIELDS))
  if not wrote(f) or not f[1] then return {kind = 'missing'} end  -- no hash there (or no data in it)
  local job = {kind = 'started', data = f[1], status = f[2], timeout = default_timeout, tokens = 0, reply_to = f[12] or '',
               deliveries = 0, lapses = 0, callbacks = (f[9] or '') ~= '' or (f[10] or '') ~= '' or (f[11] or '') ~= ''}
  if f[2] == 'canceled' then
    job.kind, job.tokens = 'canceled', math.max(0, integer(f[7]) or 0)  -- back off the queue's counter
    return job
  end
  if f[2] == 'finished' or f[2] == 'failed' then return {kind = 'stale'} end
  local bad = {}
  if f[2] and not WAITING[f[2]] then bad[#bad + 1] = 'status' end
  if f[3] and f[3] ~= '' then
    local timeout = number(f[3])
    if timeout == nil or (timeout <= 0 and timeout ~= -1) then bad[#bad + 1] = 'timeout' else job.timeout = timeout end
  end
  job.result_ttl, job.failure_ttl = ttl_field(f[4]), ttl_field(f[5])
  if job.result_ttl == false then bad[#bad + 1] = 'result_ttl' end
  if job.failure_ttl == false then bad[#bad + 1] = 'failure_ttl' end
  for k, field in ipairs({{6, 'lapses'}, {7, 'tokens'}, {8, 'deliveries'}}) do
    local value = f[field[1]]
    if value then
      local n = integer(value)
      if n == nil or n < 0 then bad[#bad + 1] = field[2] else job[field[2]] = n end
    end
  end
  if #bad > 0 then
    job.kind = 'bad'
    job.reason = 'the job hash ' .. jobkey .. ' holds what no producer writes: ' .. table.concat(bad, ', ')
  end
  return job
end

local queues, unusable, n, tokens_taken = {}, {}, 0, 0
for q = 1, (#KEYS - 3) / 4 do
  local base = 3 + (q - 1) * 4
  local entry = {qkey = KEYS[base + 1], wip = KEYS[base + 2], canceled = KEYS[base + 3], tokens = KEYS[base + 4],
                 jobs = {}, ids = {}}
  entry.canceled_ok = usable(entry.canceled, 'zset')
  if not (usable(entry.qkey, 'list') and usable(entry.wip, 'zset')) then
    unusable[#unusable + 1] = q
  elseif n == 0 and wanted > 0 then
    local ids = redis.call('LRANGE', entry.qkey, 0, wanted - 1)
    for _, id in ipairs(ids) do
      if token_limit > 0 and tokens_taken >= token_limit then break end
      n = n + 1
      local job = judge(id)
      entry.ids[#entry.ids + 1] = id
      entry.jobs[#entry.jobs + 1] = job
      tokens_taken = tokens_taken + (job.tokens or 0)
    end
  end
  queues[q] = entry
end

-- 2. write --------------------------------------------------------------------------------------------
local out, members, longest, taken_n = {}, {}, 0, 0
for q, entry in pairs(queues) do
  if #entry.ids > 0 then
    redis.call('LTRIM', entry.qkey, #entry.ids, -1)
    local started, taken_tokens, canceled = {}, 0, {}
    for i, id in ipairs(entry.ids) do
      local job = entry.jobs[i]
      if job.kind == 'started' or job.kind == 'bad' then
        taken_n = taken_n + 1
        taken_tokens = taken_tokens + (job.tokens or 0)
        local execution = ARGV[5] .. taken_n
        local member = id .. ':' .. execution
        local jobkey = JOB .. id
        local deliveries = job.deliveries
        if job.kind == 'started' then
          local exkey = EXECUTION .. member  -- rq's execution records: bookkeeping, written where they can be
          if wrote(redis.pcall('HSET', exkey, 'id', execution, 'job_id', id, 'created_at', ARGV[3],
                               'last_heartbeat', ARGV[3], 'worker_name', worker)) then
            redis.call('EXPIRE', exkey, ttl)
          end
          if wrote(redis.pcall('ZADD', EXECUTIONS .. id, now + ttl + 60, execution)) then
            redis.call('EXPIRE', EXECUTIONS .. id, ttl + 60)
          end
          deliveries = redis.call('HINCRBY', jobkey, 'deliveries', 1)
        end
        redis.call('HSET', jobkey, 'last_heartbeat', iso, 'status', 'started', 'started_at', iso, 'worker_name', worker)
        if job.callbacks then  -- never imported by anyone: rq would import what they name
          redis.call('HSET', jobkey, 'success_callback_name', '', 'failure_callback_name', '',
                     'stopped_callback_name', '')
        end
        redis.call('PERSIST', jobkey)
        started[#started + 1] = clock + lease + grace
        started[#started + 1] = member
        members[#members + 1] = member
        longest = ttl
        out[#out + 1] = {q, id, job.kind, execution, job.data, tostring(job.timeout), job.result_ttl or '',
                         job.failure_ttl or '', deliveries, job.lapses, job.reason or '', job.reply_to}
      elseif job.kind == 'canceled' then
        canceled[#canceled + 1] = now
        canceled[#canceled + 1] = id
        taken_tokens = taken_tokens + job.tokens
        out[#out + 1] = {q, id, 'canceled', '', job.data, job.reply_to}
      else
        out[#out + 1] = {q, id, job.kind}
      end
    end
    if #started > 0 then bulk('ZADD', entry.wip, started) end
    if #canceled > 0 and entry.canceled_ok then
      bulk('ZADD', entry.canceled, canceled)
      redis.call('ZREMRANGEBYSCORE', entry.canceled, '-inf', '(' .. (now - canceled_ttl))
    end
    -- the counter is an estimate kept by producers (INCRBY) and takers (DECRBY); an empty queue has none,
    -- which also heals any drift (jobs that expired in the queue, a producer that died mid-way)
    if redis.call('LLEN', entry.qkey) == 0 then
      redis.call('DEL', entry.tokens)
    else
      move_counter(entry.tokens, -taken_tokens)
    end
  end
end
if longest > 0 then
  if executions_ok then
    bulk('SADD', KEYS[2], members)
    redis.call('EXPIRE', KEYS[2], longest + 60)
  end
  if worker_ok then redis.call('HSET', KEYS[1], 'state', 'busy', 'last_heartbeat', iso) end
end
return {0, out, unusable}
