-- enqueue: put the requests of one or more callers (an AsyncProducer's coalesced round) on a queue as rq
-- jobs, in one run: each caller's all or none, each id new. A caller-given id (a Batch API line's, a retried
-- submit's) that already names a job or a result is refused: ids are never reused, so no request can take
-- over another's job or answer. A producer's own new random id is not looked up (no id is ever drawn twice).
-- Callers are judged in order, each against the queue as the callers before it left it.
--
-- KEYS[1] rq:queue:<q>                   LIST    RPUSH (LPUSH at the front: a spread request's parts); LLEN
--                                                only under a depth limit
-- KEYS[2] rq:queues                      SET     SADD the queue's key (rq lists its queues there), when asked:
--                                                a producer asks once per queue, workers keep it there (recover)
-- KEYS[3] embedfleet:queued_tokens:<q>   STRING  INCRBY the jobs' estimated tokens (reset if no whole number)
-- per id: rq:job:<id> HASH (EXISTS when checked; HSET rq's fields and `tokens`, EXPIRE),
--         embedfleet:result:<id> (EXISTS when checked)
-- ARGV: 1 '1' = at the queue's head, 2 most ids the queue may hold (0: no limit), 3 job key ttl (s),
--       4 '1' = SADD the queue's key into rq:queues; then per caller: its number of jobs, then per job: id,
--       '1' = check that the id is unused (a caller-given id) / '0' (a producer's new random id), estimated
--       tokens, number of field/value pairs N, then the N pairs (rq's job hash, as rq builds it:
--       common/protocol/rqjobs.py)
-- Returns one reply per caller: {1} (enqueued), {0, id} (that id is in use: nothing of it enqueued) or
-- {-1, depth} (the queue held `depth` ids and these would pass the limit: nothing of it enqueued).

local front, limit, ttl, announce = ARGV[1] == '1', integer(ARGV[2]), integer(ARGV[3]), ARGV[4] == '1'
if not (limit and ttl and ttl > 0) then return redis.error_reply('enqueue: bad arguments') end
local no_list = 'enqueue: ' .. KEYS[1] .. ' is no list'

-- the error a refused push answers with: the queue's type said plainly; any other (OOM: a full Redis refuses
-- a script's first write) as Redis said it
local function refused(reply)
  if string.find(reply['err'], 'WRONGTYPE', 1, true) then return redis.error_reply(no_list) end
  return reply
end

-- 1. read and judge ---------------------------------------------------------------------------------
local callers, seen, i = {}, {}, 5
while i <= #ARGV do
  local count = integer(ARGV[i])
  if not count or count < 1 then return redis.error_reply('enqueue: bad job count ' .. tostring(ARGV[i])) end
  i = i + 1
  local caller = {jobs = {}}
  for _ = 1, count do
    local id, check, tokens, pairs_ = ARGV[i], ARGV[i + 1] == '1', integer(ARGV[i + 2]), integer(ARGV[i + 3])
    if not (valid_id(id) and tokens and tokens >= 0 and pairs_ and pairs_ >= 0) or i + 3 + 2 * pairs_ > #ARGV then
      return redis.error_reply('enqueue: bad arguments for job ' .. tostring(id))
    end
    if check and not caller.reply and (seen[id] or redis.call('EXISTS', JOB .. id, RESULT .. id) > 0) then
      caller.reply = {0, id}
    end
    caller.jobs[#caller.jobs + 1] = {id = id, tokens = tokens, first = i + 4, last = i + 3 + 2 * pairs_}
    i = i + 4 + 2 * pairs_
  end
  if not caller.reply then
    for _, job in ipairs(caller.jobs) do seen[job.id] = true end
  end
  callers[#callers + 1] = caller
end
local depth = 0
if limit > 0 then
  depth = redis.pcall('LLEN', KEYS[1])
  if not wrote(depth) then return refused(depth) end
end
local ids, total, replies = {}, 0, {}
for c, caller in ipairs(callers) do
  if not caller.reply and limit > 0 and depth + #ids + #caller.jobs > limit then caller.reply = {-1, depth + #ids} end
  if not caller.reply then
    caller.reply = {1}
    for _, job in ipairs(caller.jobs) do
      ids[#ids + 1] = job.id
      total = total + job.tokens
    end
  end
  replies[c] = caller.reply
end
if #ids == 0 then return replies end

-- on a Redis Cluster (KEYS[2] is the queue itself there) a read of the first new job key first: while the slot
-- is being moved, a key that is not here stops the script now, before any write (slotmoves.py), not at its HSET
if KEYS[2] == KEYS[1] then redis.call('EXISTS', JOB .. ids[1]) end

-- 2. write: the push first, through pcall, so that a queue key of a foreign type refuses it all ---------
local pushed
if front then  -- LPUSH puts each at the head: the last id first, so that they keep their order
  local reversed = {}
  for k = #ids, 1, -1 do reversed[#reversed + 1] = ids[k] end
  for k = 1, #reversed, 4000 do
    pushed = redis.pcall('LPUSH', KEYS[1], unpack(reversed, k, math.min(k + 3999, #reversed)))
    if not wrote(pushed) then return refused(pushed) end
  end
else
  for k = 1, #ids, 4000 do
    pushed = redis.pcall('RPUSH', KEYS[1], unpack(ids, k, math.min(k + 3999, #ids)))
    if not wrote(pushed) then return refused(pushed) end
  end
end
for _, caller in ipairs(callers) do
  if caller.reply[1] == 1 then
    for _, job in ipairs(caller.jobs) do
      local jobkey = JOB .. job.id
      redis.call('HSET', jobkey, 'tokens', job.tokens, unpack(ARGV, job.first, job.last))
      redis.call('EXPIRE', jobkey, ttl)
    end
  end
end
move_counter(KEYS[3], total)
if announce then redis.pcall('SADD', KEYS[2], KEYS[1]) end
return replies
