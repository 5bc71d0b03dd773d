-- give back: a draining (or yielding) worker returns jobs it took but has not started on the device: its
-- claims are removed and the ids go back to the head of the queue, in their order, as if never taken (the
-- delivery is not counted).
--
-- KEYS[1] rq:queue:<q>                   LIST    LPUSH
-- KEYS[2] rq:wip:<q>                     ZSET    ZSCORE, ZREM
-- KEYS[3] rq:worker:<name>:executions    SET     SREM
-- KEYS[4] embedfleet:queued_tokens:<q>   STRING  INCRBY the returned jobs' `tokens` (DEL if no whole number)
-- per id: rq:execution:<id>:<execution> HASH (DEL), rq:executions:<id> ZSET (ZREM), rq:job:<id> HASH
--         (HMGET status/deliveries/tokens; when still started: HSET status/enqueued_at, HINCRBY deliveries -1,
--         EXPIRE: it waits with a queued job's TTL again)
-- ARGV: 1 now (rq time), 2 a queued job key's TTL (s), then per job: id, execution
-- Returns the number of jobs returned (a claim that had lapsed was requeued by recover instead).

local job_ttl = integer(ARGV[2])
if #ARGV % 2 ~= 0 or not job_ttl or job_ttl <= 0 then return redis.error_reply('give back: bad arguments') end
if not usable(KEYS[1], 'list') or not usable(KEYS[2], 'zset') then return 0 end
local executions_ok = usable(KEYS[3], 'set')
local tokens, back = 0, {}
for i = 3, #ARGV, 2 do
  local id, execution = ARGV[i], ARGV[i + 1]
  local member = id .. ':' .. execution
  if valid_id(id) and redis.call('ZSCORE', KEYS[2], member) then
    local job = {id = id, execution = execution, member = member, executions = usable(EXECUTIONS .. id, 'zset')}
    if kind(JOB .. id) == 'hash' then
      local f = redis.call('HMGET', JOB .. id, 'status', 'deliveries', 'tokens')
      job.requeue = f[1] == 'started'
      job.deliveries = integer(f[2]) ~= nil
      local n = f[3] and integer(f[3])
      if job.requeue and n and n > 0 then tokens = tokens + n end
    end
    back[#back + 1] = job
  end
end
local ids = {}
for _, job in ipairs(back) do
  redis.call('ZREM', KEYS[2], job.member)
  if executions_ok then redis.call('SREM', KEYS[3], job.member) end
  redis.call('DEL', EXECUTION .. job.member)
  if job.executions then redis.call('ZREM', EXECUTIONS .. job.id, job.execution) end
  if job.requeue then
    redis.call('HSET', JOB .. job.id, 'status', 'queued', 'enqueued_at', ARGV[1])
    if job.deliveries then redis.call('HINCRBY', JOB .. job.id, 'deliveries', -1) end
    redis.call('EXPIRE', JOB .. job.id, job_ttl)
    ids[#ids + 1] = job.id
  end
end
move_counter(KEYS[4], tokens)
for i = #ids, 1, -1 do redis.call('LPUSH', KEYS[1], ids[i]) end
return #ids
