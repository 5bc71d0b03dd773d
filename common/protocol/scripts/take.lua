-- take: move up to ARGV[1] job ids from a model's queues (its priority levels, in the order given: a round
-- comes from the first that has any, never from two, so that a round of interactive work carries no bulk
-- work it would wait for) straight into each queue's started registry, in one atomic step (no intermediate
-- list). What it records besides the claim depends on the worker's --rq-records (docs/capacity.md): `lean`
-- writes what rq's tools and embedfleet read (the claim, the job's status and deliveries); `full` adds what
-- rq's own prepare_execution + prepare_job_execution write (the execution hash and its registry, the
-- worker's executions set and state, no TTL on a started job).
--
-- KEYS[1] rq:worker:<name>             HASH    HSET state (through pcall): ARGV[12] when it claims jobs,
--                                              ARGV[13] when it claims none ('' = leave it); full: HSET state
--                                              busy and last_heartbeat whenever it claims jobs
-- KEYS[2] rq:worker:<name>:executions  SET     full: SADD <id>:<execution>, EXPIRE (through pcall)
-- KEYS[3] rq:suspended                 any     EXISTS (set: take nothing)
-- then per queue, 4 keys:
--   rq:queue:<q>                       LIST    LPOP (count), LPUSH (what a round's token limit leaves, or
--                                              all of it back when the started registry is no zset); EXISTS
--                                              of the queues after the one taken from (are they empty?)
--   rq:wip:<q>                         ZSET    ZADD <id>:<execution> (score: the lease, below)
--   rq:canceled:<q>                    ZSET    ZADD (a job cancelled while queued), ZREMRANGEBYSCORE (bound)
--   embedfleet:queued_tokens:<q>       STRING  DECRBY the taken jobs' `tokens`; DEL when the take empties the
--                                              queue or the counter is no whole number
-- per id: rq:job:<id> HASH (HMGET; HSET status/started_at/last_heartbeat/worker_name/deliveries; HSET '' over
--         any callback name; full: PERSIST), full: rq:execution:<id>:<execution> HASH (HSET, EXPIRE),
--         rq:executions:<id> ZSET (ZADD, EXPIRE; both through pcall: rq's bookkeeping, kept where it can be)
-- ARGV: 1 max ids, 2 worker name, 3 now (unix s), 4 now (rq time), 5 execution id prefix (56 hex characters),
--       6 default job timeout (s), 7 lease (s), 8 lease grace (s), 9 how long a cancelled id stays in
--       rq:canceled:<q> (s), 10 most estimated tokens a round holds (0: no limit; the job that reaches it
--       is still taken: a round is cut by the work its jobs say they hold, at least one job), 11 `lean` or
--       `full` (what it records), 12 and 13 the worker's rq state to write when it claims jobs / none ('':
--       none; the worker writes a state only when it changes)
-- The lease: score = the server's clock (TIME) + lease + grace; job field `deliveries` + 1.
--
-- Returns {suspended, {{queue, id, kind, execution, data, timeout, result_ttl, failure_ttl, deliveries,
--          lapses, reason, reply_to, options}...}, {unusable queue positions}, {per queue: 1 if it is known
-- to be empty now, else 0}}; queue: its position among the queues (1 = the first). kind: started | bad
-- (claimed like started, to be failed with `reason`: a field of the job that no producer writes) | canceled
-- ({queue, id, kind, '', data, reply_to, options}) | missing (no job hash: dropped, as rq drops it; a hash
-- without `data` is bad) | badid
-- (no job can have that id) | stale (already ended). A queue whose list or started registry is of the
-- wrong type is left alone (what was popped goes back) and named in the third list.
--
-- The ids are popped first, then judged (reads only), then the claims are written with the started
-- registry's ZADD first, through pcall: a registry of a foreign type puts every id back where it was.

local now, iso, worker = number(ARGV[3]), ARGV[4], ARGV[2]
local wanted, default_timeout = integer(ARGV[1]), number(ARGV[6])
local lease, grace, canceled_ttl = number(ARGV[7]), number(ARGV[8]), number(ARGV[9])
local token_limit, full = integer(ARGV[10] or '0'), ARGV[11] == 'full'
local busy_state, idle_state = ARGV[12] or '', ARGV[13] or ''
if not (now and wanted and default_timeout and lease and grace and canceled_ttl and token_limit) then
  return redis.error_reply('take: bad arguments')
end
local levels = (#KEYS - 3) / 4
if redis.call('EXISTS', KEYS[3]) == 1 then return {1, {}, {}, {}} end

-- 1. pop and judge -----------------------------------------------------------------------------------
local FIELDS = {'data', 'status', 'timeout', 'result_ttl', 'failure_ttl', 'lapses', 'tokens', 'deliveries',
                'success_callback_name', 'failure_callback_name', 'stopped_callback_name', 'reply_to', 'options'}
local WAITING = {queued = true, started = true, deferred = true, scheduled = true, stopped = true}
local COUNTS = {{6, 'lapses'}, {7, 'tokens'}, {8, 'deliveries'}}  -- whole-number fields: HMGET position, name

-- a TTL field: absent, empty or a whole number (rq writes -1 for "never"); false when it is none of these
local function ttl_field(value)
  if value == false or value == '' then return '' end
  return integer(value) and value or false
end

local function judge(id)
  if not valid_id(id) then return {kind = 'badid'} end
  local jobkey = JOB .. id
  local f = redis.pcall('HMGET', jobkey, unpack(FIELDS))
  if not wrote(f) then return {kind = 'missing'} end
  local nodata = not f[1]
  if nodata and redis.call('EXISTS', jobkey) == 0 then return {kind = 'missing'} end  -- no hash: dropped, as rq does
  local job = {kind = 'started', data = f[1] or '', status = f[2], timeout = default_timeout, tokens = 0, reply_to = f[12] or '',
               options = f[13] and '1' or '', deliveries = 0, lapses = 0,
               callbacks = (f[9] or '') ~= '' or (f[10] or '') ~= '' or (f[11] or '') ~= ''}
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
  for _, field in ipairs(COUNTS) do
    local value = f[field[1]]
    if value then
      local n = integer(value)
      if n == nil or n < 0 then bad[#bad + 1] = field[2] else job[field[2]] = n end
    end
  end
  if nodata then  -- a hash no producer wrote: failed with its reason, so that its waiters learn it at once
    job.kind = 'bad'
    job.reason = 'the job hash ' .. jobkey .. ' has no data field (no producer writes such a job)'
  elseif #bad > 0 then
    job.kind = 'bad'
    job.reason = 'the job hash ' .. jobkey .. ' holds what no producer writes: ' .. table.concat(bad, ', ')
  end
  return job
end

-- put ids back at the head of a queue, in their order
local function give_back(qkey, ids, from)
  local back = {}
  for k = #ids, from, -1 do back[#back + 1] = ids[k] end
  bulk('LPUSH', qkey, back)
end

local entry, unusable, empty, later = nil, {}, {}, {}
for q = 1, levels do
  local base = 3 + (q - 1) * 4
  empty[q] = 0
  if entry == nil and wanted > 0 then
    local popped = redis.pcall('LPOP', KEYS[base + 1], wanted)
    if not wrote(popped) then
      unusable[#unusable + 1] = q
    elseif not popped then
      empty[q] = 1
    else
      entry = {q = q, qkey = KEYS[base + 1], wip = KEYS[base + 2], canceled = KEYS[base + 3], tokens = KEYS[base + 4],
               jobs = {}, ids = {}, popped = popped}
      local tokens = 0
      for _, id in ipairs(popped) do
        if token_limit > 0 and tokens >= token_limit then break end
        local job = judge(id)
        entry.ids[#entry.ids + 1] = id
        entry.jobs[#entry.jobs + 1] = job
        tokens = tokens + (job.tokens or 0)
      end
      -- fewer popped than asked and none left over: the take emptied the queue
      if #popped < wanted and #entry.ids == #popped then empty[q] = 1 end
    end
  elseif entry ~= nil then
    later[#later + 1] = KEYS[base + 1]
  end
end
if #later > 0 and redis.call('EXISTS', unpack(later)) == 0 then
  for q = entry.q + 1, levels do empty[q] = 1 end
end
if entry == nil then
  if idle_state ~= '' then redis.pcall('HSET', KEYS[1], 'state', idle_state) end
  return {0, {}, unusable, empty}
end

-- 2. write --------------------------------------------------------------------------------------------
-- An execution id is hex like rq's (uuid4().hex: 32 characters): this take's random prefix and the job's
-- number in it, and longer for a short job id, so that every started-registry member `<id>:<execution>` is
-- over 64 bytes. A zset whose members are all within zset-max-listpack-value (64 by default) is a listpack,
-- where each insert scans and shifts the whole list: a take's ZADD of 64 claims cost Redis 0.4-1.2 ms
-- there, ~0.05 ms in the skiplist that one longer member makes it (docs/capacity.md).
local function execution_id(id, n)
  local width = math.max(32, 64 - #id)
  return string.sub(ARGV[5], 1, width - 8) .. string.format('%08x', n)
end
local clock, ttl = server_time(), math.ceil(lease + grace)
local started, members, taken_n = {}, {}, 0
for i, id in ipairs(entry.ids) do
  local job = entry.jobs[i]
  if job.kind == 'started' or job.kind == 'bad' then
    taken_n = taken_n + 1
    job.execution = execution_id(id, taken_n)
    job.member = id .. ':' .. job.execution
    started[#started + 1] = clock + lease + grace
    started[#started + 1] = job.member
    members[#members + 1] = job.member
  end
end
if #started > 0 and not pbulk('ZADD', entry.wip, started) then
  -- no claim can be written: every id goes back where it was
  give_back(entry.qkey, entry.popped, 1)
    unusable[#unusable + 1] = entry.q
    empty[entry.q] = 0
    return {0, {}, unusable, empty}
end
if #entry.ids < #entry.popped then give_back(entry.qkey, entry.popped, #entry.ids + 1) end

local out, canceled, taken_tokens = {}, {}, 0
for i, id in ipairs(entry.ids) do
  local job = entry.jobs[i]
  local jobkey = JOB .. id
  if job.kind == 'started' or job.kind == 'bad' then
    taken_tokens = taken_tokens + (job.tokens or 0)
    local deliveries = job.deliveries
    if job.kind == 'started' then
      deliveries = deliveries + 1
      redis.call('HSET', jobkey, 'status', 'started', 'started_at', iso, 'last_heartbeat', iso, 'worker_name', worker,
                 'deliveries', deliveries)
    else
      redis.call('HSET', jobkey, 'status', 'started', 'started_at', iso, 'last_heartbeat', iso, 'worker_name', worker)
    end
    if job.callbacks then  -- never imported by anyone: rq would import what they name
      redis.call('HSET', jobkey, 'success_callback_name', '', 'failure_callback_name', '', 'stopped_callback_name', '')
    end
    if full then
      redis.call('PERSIST', jobkey)
      local exkey = EXECUTION .. job.member  -- rq's execution records: bookkeeping, written where they can be
      if wrote(redis.pcall('HSET', exkey, 'id', job.execution, 'job_id', id, 'created_at', ARGV[3],
                           'last_heartbeat', ARGV[3], 'worker_name', worker)) then
        redis.call('EXPIRE', exkey, ttl)
      end
      if wrote(redis.pcall('ZADD', EXECUTIONS .. id, now + ttl + 60, job.execution)) then
        redis.call('EXPIRE', EXECUTIONS .. id, ttl + 60)
      end
    end
    out[#out + 1] = {entry.q, id, job.kind, job.execution, job.data, tostring(job.timeout), job.result_ttl or '',
                     job.failure_ttl or '', deliveries, job.lapses, job.reason or '', job.reply_to, job.options}
  elseif job.kind == 'canceled' then
    canceled[#canceled + 1] = now
    canceled[#canceled + 1] = id
    taken_tokens = taken_tokens + job.tokens
    out[#out + 1] = {entry.q, id, 'canceled', '', job.data, job.reply_to, job.options}
  else
    out[#out + 1] = {entry.q, id, job.kind}
  end
end
if #canceled > 0 and pbulk('ZADD', entry.canceled, canceled) then
  redis.call('ZREMRANGEBYSCORE', entry.canceled, '-inf', '(' .. (now - canceled_ttl))
end
-- the counter is an estimate kept by producers (INCRBY) and takers (DECRBY); an emptied queue has none,
-- which also heals any drift (jobs that expired in the queue, a producer that died mid-way)
if empty[entry.q] == 1 then
  redis.call('DEL', entry.tokens)
else
  move_counter(entry.tokens, -taken_tokens)
end
if full and #members > 0 then
  if pbulk('SADD', KEYS[2], members) then redis.call('EXPIRE', KEYS[2], ttl + 60) end
  redis.pcall('HSET', KEYS[1], 'state', 'busy', 'last_heartbeat', iso)
elseif #members > 0 and busy_state ~= '' then
  redis.pcall('HSET', KEYS[1], 'state', busy_state)
elseif #members == 0 and idle_state ~= '' then
  redis.pcall('HSET', KEYS[1], 'state', idle_state)
end
return {0, out, unusable, empty}
