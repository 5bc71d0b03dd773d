-- enqueue: put requests on a queue as rq jobs, all or none, each id new: an id that already names a job or
-- a result is refused (ids are never reused, so no request can take over another's job or answer).
--
-- KEYS[1] rq:queue:<q>                   LIST    LLEN, RPUSH (LPUSH at the front: a spread request's parts)
-- KEYS[2] rq:queues                      SET     SADD the queue's key (rq lists its queues there)
-- KEYS[3] embedfleet:queued_tokens:<q>   STRING  INCRBY the jobs' estimated tokens (DEL if no whole number)
-- per id: rq:job:<id> HASH (EXISTS; HSET rq's fields and `tokens`, EXPIRE), embedfleet:result:<id> (EXISTS)
-- ARGV: 1 '1' = at the queue's head, 2 most ids the queue may hold (0: no limit), 3 job ttl (s), then per
--       job: id, estimated tokens, number of field/value pairs N, then the N pairs (rq's job hash, as rq
--       builds it: common/protocol/operations.py)
-- Returns {1} (enqueued), {0, id} (that id is in use: nothing enqueued) or {-1, depth} (the queue holds
-- `depth` ids and these would pass the limit: nothing enqueued).

local front, limit, ttl = ARGV[1] == '1', integer(ARGV[2]), integer(ARGV[3])
if not (limit and ttl and ttl > 0) then return redis.error_reply('enqueue: bad arguments') end
if not usable(KEYS[1], 'list') then return redis.error_reply('enqueue: ' .. KEYS[1] .. ' is no list') end

-- 1. read and judge ---------------------------------------------------------------------------------
local jobs, i, total = {}, 4, 0
while i <= #ARGV do
  local id, tokens, pairs_ = ARGV[i], integer(ARGV[i + 1]), integer(ARGV[i + 2])
  if not (valid_id(id) and tokens and tokens >= 0 and pairs_ and pairs_ >= 0) or i + 2 + 2 * pairs_ > #ARGV then
    return redis.error_reply('enqueue: bad arguments for job ' .. tostring(id))
  end
  if redis.call('EXISTS', JOB .. id, RESULT .. id) > 0 then return {0, id} end
  jobs[#jobs + 1] = {id = id, tokens = tokens, first = i + 3, last = i + 2 + 2 * pairs_}
  total = total + tokens
  i = i + 3 + 2 * pairs_
end
local depth = redis.call('LLEN', KEYS[1])
if limit > 0 and depth + #jobs > limit then return {-1, depth} end

-- 2. write --------------------------------------------------------------------------------------------
if usable(KEYS[2], 'set') then redis.call('SADD', KEYS[2], KEYS[1]) end
local ids = {}
for _, job in ipairs(jobs) do
  local jobkey = JOB .. job.id
  redis.call('HSET', jobkey, 'tokens', job.tokens, unpack(ARGV, job.first, job.last))
  redis.call('EXPIRE', jobkey, ttl)
  ids[#ids + 1] = job.id
end
if front then
  for k = #ids, 1, -1 do redis.call('LPUSH', KEYS[1], ids[k]) end
else
  bulk('RPUSH', KEYS[1], ids)
end
move_counter(KEYS[3], total)
return {1}
