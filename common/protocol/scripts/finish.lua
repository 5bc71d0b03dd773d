-- finish: answer each job (lib's publish) and end its claim, only while this worker's claim stands. What it
-- records besides depends on the worker's --rq-records (docs/capacity.md): `lean` removes a served job's hash
-- (its answer is the result blob) and keeps rq's records of failed jobs; `full` writes what rq's own worker
-- writes for every job (status, finished registry, execution records, the worker's counters).
--
-- KEYS[1] rq:queue:<q>                LIST    RPUSH / LPUSH (a retry)
-- KEYS[2] rq:wip:<q>                  ZSET    ZREM (one claim: its ZREM is the claim check) or ZMSCORE (the
--                                             claims) then ZREM
-- KEYS[3] rq:finished:<q>             ZSET    full: ZADD
-- KEYS[4] rq:failed:<q>               ZSET    ZADD
-- KEYS[5] rq:worker:<name>            HASH    HINCRBY failed_job_count; full: HINCRBY successful_job_count,
--                                             HINCRBYFLOAT total_working_time (through pcall)
-- KEYS[6] rq:worker:<name>:executions SET     full: SREM
-- per id: rq:job:<id> HASH (lean, served: DEL, but for a request answered by its parts: status finished,
--         EXPIRE; HMGET retries_left/enqueue_at_front_on_retry; HSET status/ended_at/exc_info/retries_left/
--         enqueued_at, EXPIRE), rq:results:<id> STREAM (XADD, EXPIRE: failed jobs only), full:
--         rq:execution:<id>:<execution> (DEL), rq:executions:<id> ZSET (ZREM); and publish's keys (lib.lua):
--         embedfleet:result:<id> STRING (SET EX; a served answer's blob is SET by the worker's pipeline just
--         before this script, `stored`: through Lua a blob is copied twice, ~120 us of Redis per 100 KB),
--         embedfleet:notify:<id> LIST (RPUSH, EXPIRE) or the request's reply stream STREAM (XADD MAXLEN ~,
--         EXPIRE once per stream), embedfleet:job:<id> (EXPIRE, when the job has options)
-- ARGV: 1 worker name, 2 now (unix s), 3 now (rq time), 4 working seconds, 5 result blob ttl (s), 6 `lean` or
--       `full`, 7 the number S of served jobs whose blob the pipeline SET just before this script, then per
--       such job 5 values: id, execution, reply_to ('' = none), options ('1': the job has gateway options),
--       rq ttl (s); then per other job 11 values: id, execution, outcome (finished|failed|retry|canceled),
--       blob ('' = none), reply_to, rq payload (failed: base64 zlib exc_string; '' otherwise), exc_info
--       (zlib), rq ttl (s), nx ('1': keep a stored answer), execution start (unix s), options
--
-- Returns {finished, failed, requeued, late, {id, problem}...}: late = answered, but the claim had lapsed
-- (rq left as is); a problem = what could not be done as asked, and why (a retry whose count is no whole
-- number: failed instead; a job hash or rq result stream of a foreign type: not written).

local worker, now, iso = ARGV[1], number(ARGV[2]), ARGV[3]
local working, blob_ttl, full = number(ARGV[4]), integer(ARGV[5]), ARGV[6] == 'full'
local served = integer(ARGV[7])
if not (now and working and blob_ttl and blob_ttl > 0 and served and served >= 0) or #ARGV < 7 + 5 * served
    or (#ARGV - 7 - 5 * served) % 11 ~= 0 then
  return redis.error_reply('finish: bad arguments')
end
local OUTCOMES = {finished = true, failed = true, retry = true, canceled = true}

-- 1. read and judge ---------------------------------------------------------------------------------
local jobs, problems, claims = {}, {}, {}
local function add(job)
  if not valid_id(job.id) or not OUTCOMES[job.outcome] or not job.ttl or job.ttl <= 0 then
    return redis.error_reply('finish: bad arguments for job ' .. tostring(job.id))
  end
  job.member = job.id .. ':' .. job.execution
  if job.outcome ~= 'canceled' and job.execution ~= '' then claims[#claims + 1] = job end
  jobs[#jobs + 1] = job
end
local last = 7 + 5 * served
for i = 8, last, 5 do
  local bad = add({id = ARGV[i], execution = ARGV[i + 1], outcome = 'finished', blob = '', reply_to = ARGV[i + 2],
                   options = ARGV[i + 3] == '1', ttl = integer(ARGV[i + 4]), stored = true})
  if bad then return bad end
end
for i = last + 1, #ARGV, 11 do
  local bad = add({id = ARGV[i], execution = ARGV[i + 1], outcome = ARGV[i + 2], blob = ARGV[i + 3],
                   reply_to = ARGV[i + 4], payload = ARGV[i + 5], exc_info = ARGV[i + 6], ttl = integer(ARGV[i + 7]),
                   nx = ARGV[i + 8] == '1', started = ARGV[i + 9], options = ARGV[i + 10] == '1'})
  if bad then return bad end
end
-- which claims stand: one claim's own ZREM says it (and ends it); several are read in one ZMSCORE, and
-- those that stand are removed in one ZREM below. A registry of a foreign type holds no claim.
local removed = false
if #claims == 1 then
  local gone = redis.pcall('ZREM', KEYS[2], claims[1].member)
  claims[1].claimed, removed = gone == 1, true
elseif #claims > 1 then
  local members = {}
  for _, job in ipairs(claims) do members[#members + 1] = job.member end
  for k = 1, #members, 4000 do
    local scores = redis.pcall('ZMSCORE', KEYS[2], unpack(members, k, math.min(k + 3999, #members)))
    if wrote(scores) then
      for j, score in ipairs(scores) do claims[k + j - 1].claimed = score ~= false end
    end
  end
end
local queue_ok = nil
for _, job in ipairs(jobs) do
  if job.claimed and job.outcome == 'retry' then
    if queue_ok == nil then queue_ok = usable(KEYS[1], 'list') end
    local f = redis.pcall('HMGET', JOB .. job.id, 'retries_left', 'enqueue_at_front_on_retry')
    local left = wrote(f) and f[1] and integer(f[1]) or 0
    if not wrote(f) or (f[1] and integer(f[1]) == nil) then
      problems[#problems + 1] = {job.id, 'its retries_left is unreadable: failed, not retried'}
    elseif left > 0 and not queue_ok then
      problems[#problems + 1] = {job.id, 'its queue is no list: failed, not retried'}
      left = 0
    end
    if left > 0 then job.left, job.front = left, f[2] == '1' else job.outcome = 'failed' end
  end
end

-- 2. write --------------------------------------------------------------------------------------------
local ok, bad, requeued, late = 0, 0, 0, 0
local ended, finished, failed = {}, {}, {}

local function answer(job)
  if job.stored then
    wake(job.id, blob_ttl, job.reply_to, job.options)
  elseif job.blob ~= '' then
    publish(job.id, job.blob, blob_ttl, job.nx, job.reply_to, job.options)
  end
end

local function rq_result(job, kind_, field)
  local rkey = RESULTS .. job.id
  if wrote(redis.pcall('XADD', rkey, 'MAXLEN', '~', 10, '*', 'type', kind_, 'worker_name', worker, field,
                       job.payload, 'execution_id', job.execution, 'execution_started_at', job.started,
                       'execution_ended_at', ARGV[2])) then
    redis.call('EXPIRE', rkey, job.ttl)
  else
    problems[#problems + 1] = {job.id, rkey .. ' is no stream: no rq result written'}
  end
end

-- the job hash's new fields, then its TTL; false when the key holds no hash (nothing written to it)
local function set_job(job, ...)
  if wrote(redis.pcall('HSET', JOB .. job.id, ...)) then
    redis.call('EXPIRE', JOB .. job.id, job.ttl)
    return true
  end
  problems[#problems + 1] = {job.id, JOB .. job.id .. ' is no hash: its rq status is not written'}
  return false
end

local function end_claim(job)
  if full then
    redis.call('DEL', EXECUTION .. job.member)
    redis.pcall('ZREM', EXECUTIONS .. job.id, job.execution)
  end
  ended[#ended + 1] = job.member
end

for _, job in ipairs(jobs) do
  if job.outcome == 'canceled' then
    answer(job)
  elseif not job.claimed then
    -- rq's maintenance or recover took the job back (this worker looked dead): the answer is still valid
    if job.outcome == 'finished' then answer(job) end
    late = late + 1
  elseif job.outcome == 'finished' then
    -- no rq result stream for a served job: its answer is the result blob, and a one-entry stream costs
    -- ~4.7 KB of Redis per request (more than the 384-dim answer itself). A failed one keeps rq's record.
    end_claim(job)
    if full or (job.blob == '' and not job.stored) then  -- lean keeps the status of a request whose parts
      -- still run: it says their request is under way
      set_job(job, 'status', 'finished', 'ended_at', iso)
      finished[#finished + 1] = now + job.ttl
      finished[#finished + 1] = job.id
    else
      redis.call('DEL', JOB .. job.id)
    end
    answer(job)
    ok = ok + 1
  else
    bad = bad + 1
    end_claim(job)
    if job.outcome == 'retry' then
      redis.call('HSET', JOB .. job.id, 'status', 'queued', 'retries_left', job.left - 1, 'enqueued_at', iso)
      redis.call(job.front and 'LPUSH' or 'RPUSH', KEYS[1], job.id)
      requeued = requeued + 1
    else
      rq_result(job, '2', 'exc_string')
      set_job(job, 'status', 'failed', 'ended_at', iso, 'exc_info', job.exc_info)
      failed[#failed + 1] = now + job.ttl
      failed[#failed + 1] = job.id
      answer(job)
    end
  end
end
if #ended > 0 then
  if not removed then bulk('ZREM', KEYS[2], ended) end
  if full then pbulk('SREM', KEYS[6], ended) end
end
if #finished > 0 and full then pbulk('ZADD', KEYS[3], finished) end
if #failed > 0 then pbulk('ZADD', KEYS[4], failed) end
if bad > 0 then redis.pcall('HINCRBY', KEYS[5], 'failed_job_count', bad) end
if full then
  if ok > 0 then redis.pcall('HINCRBY', KEYS[5], 'successful_job_count', ok) end
  redis.pcall('HINCRBYFLOAT', KEYS[5], 'total_working_time', working)
end
expire_streams()
local reply = {ok, bad - requeued, requeued, late}
for _, p in ipairs(problems) do reply[#reply + 1] = p end
return reply
