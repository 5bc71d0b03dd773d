-- recover: requeue the jobs whose lease lapsed (their worker died or froze), at the head of the queue, each
-- exactly once: the script is atomic, and a claim is requeued only by the run that removes it. Cheap: one
-- ZRANGEBYSCORE with LIMIT from the low end of the registry (lapsed claims sort first), never a scan.
--
-- KEYS[1] rq:queue:<q>                   LIST    LPUSH
-- KEYS[2] rq:wip:<q>                     ZSET    ZRANGEBYSCORE LIMIT, ZREM
-- KEYS[3] embedfleet:queued_tokens:<q>   STRING  INCRBY the requeued jobs' `tokens` (DEL if no whole number)
-- KEYS[4] rq:queues                      SET     SADD the queue's key: every live worker keeps its queues
--                                                listed for `rq info` (producers add a queue only once)
-- per claim: rq:execution:<id>:<execution> HASH (HGET worker_name, DEL), rq:executions:<id> ZSET (ZREM),
--            rq:worker:<dead worker>:executions SET (SREM) (the records of --rq-records full; a lean claim's
--            owner is its job's worker_name),
--            rq:job:<id> HASH (HMGET status/lapses/tokens/worker_name; when started: HSET status/enqueued_at,
--            HINCRBY lapses, EXPIRE: a requeued job waits with a queued job's TTL again)
-- ARGV: 1 lease grace (s), 2 most claims per run, 3 now (rq time), 4 a queued job key's TTL (s)
--
-- Returns {{id, seconds past the lease's end, worker name}...}: the requeued jobs. A claim whose job is no
-- longer started (cancelled, answered late, or gone) is only removed. A job whose `lapses` or `tokens` is
-- no whole number is requeued all the same (never left outside a queue or registry) without counting
-- the lapse: the next take finds the field and fails the job with that reason.

local grace, limit, job_ttl = number(ARGV[1]), integer(ARGV[2]), integer(ARGV[4])
if not grace or not limit or not job_ttl or job_ttl <= 0 then return redis.error_reply('recover: bad arguments') end
if KEYS[4] then redis.pcall('SADD', KEYS[4], KEYS[1]) end
local clock = server_time()
local lapsed = redis.pcall('ZRANGEBYSCORE', KEYS[2], '-inf', '(' .. (clock + grace), 'WITHSCORES', 'LIMIT', 0, limit)
if not wrote(lapsed) or #lapsed == 0 or not usable(KEYS[1], 'list') then return {} end  -- (no zset: nothing)

-- 1. read and judge ---------------------------------------------------------------------------------
local claims, tokens = {}, 0
for i = 1, #lapsed, 2 do
  local member, score = lapsed[i], tonumber(lapsed[i + 1])
  local id, execution = string.match(member, '^(.*):([^:]*)$')
  local claim = {member = member, overdue = clock - (score - grace)}
  if id and valid_id(id) then
    claim.id, claim.execution = id, execution
    local exkey = EXECUTION .. member
    if kind(exkey) == 'hash' then
      local owner = redis.call('HGET', exkey, 'worker_name')
      if owner and owner ~= '' and usable(WORKER .. owner .. ':executions', 'set') then claim.owner = owner end
    end
    claim.executions = usable(EXECUTIONS .. id, 'zset')
    local jobkey = JOB .. id
    if kind(jobkey) == 'hash' then
      local f = redis.call('HMGET', jobkey, 'status', 'lapses', 'tokens', 'worker_name')
      claim.requeue = f[1] == 'started'
      if not claim.owner and f[4] and f[4] ~= '' then claim.worker = f[4] end
      claim.lapses = not f[2] or integer(f[2]) ~= nil
      local n = f[3] and integer(f[3])
      if claim.requeue and n and n > 0 then tokens = tokens + n end
    end
  end
  claims[#claims + 1] = claim
end

-- 2. write --------------------------------------------------------------------------------------------
local out, requeue = {}, {}
for _, claim in ipairs(claims) do
  redis.call('ZREM', KEYS[2], claim.member)
  if claim.id then
    redis.call('DEL', EXECUTION .. claim.member)
    if claim.executions then redis.call('ZREM', EXECUTIONS .. claim.id, claim.execution) end
    if claim.owner then redis.call('SREM', WORKER .. claim.owner .. ':executions', claim.member) end
    if claim.requeue then
      local jobkey = JOB .. claim.id
      redis.call('HSET', jobkey, 'status', 'queued', 'enqueued_at', ARGV[3])
      if claim.lapses then redis.call('HINCRBY', jobkey, 'lapses', 1) end
      requeue[#requeue + 1] = claim.id
      redis.call('EXPIRE', jobkey, job_ttl)
      out[#out + 1] = {claim.id, tostring(claim.overdue), claim.owner or claim.worker or ''}
    end
  end
end
move_counter(KEYS[3], tokens)
-- LPUSH puts each id at the head: push the latest-lapsed first so the oldest is served first
for i = #requeue, 1, -1 do redis.call('LPUSH', KEYS[1], requeue[i]) end
return out
