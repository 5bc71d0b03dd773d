-- finish: answer each job (lib's publish) and end its rq execution, only while this worker's claim stands.
--
-- KEYS[1] rq:queue:<q>                LIST    RPUSH / LPUSH (a retry)
-- KEYS[2] rq:wip:<q>                  ZSET    ZSCORE (the claim), ZREM
-- KEYS[3] rq:finished:<q>             ZSET    ZADD
-- KEYS[4] rq:failed:<q>               ZSET    ZADD
-- KEYS[5] rq:worker:<name>            HASH    HMGET, HINCRBY successful_job_count / failed_job_count,
--                                             HINCRBYFLOAT total_working_time
-- KEYS[6] rq:worker:<name>:executions SET     SREM
-- per id: rq:job:<id> HASH (HMGET retries_left/enqueue_at_front_on_retry; HSET status/ended_at/exc_info/
--         retries_left/enqueued_at, EXPIRE), rq:results:<id> STREAM (XADD, EXPIRE: failed jobs only),
--         rq:execution:<id>:<execution> (DEL), rq:executions:<id> ZSET (ZREM), and publish's keys (lib.lua):
--         embedfleet:result:<id> STRING (SET EX), embedfleet:notify:<id> LIST (RPUSH, EXPIRE),
--         embedfleet:job:<id> (EXPIRE), the request's reply stream STREAM (XADD MAXLEN ~, EXPIRE)
-- ARGV: 1 worker name, 2 now (unix s), 3 now (rq time), 4 working seconds, 5 result blob ttl (s), then per
--       job 10 values: id, execution, outcome (finished|failed|retry|canceled), blob ('' = none), reply_to
--       ('' = none), rq payload (failed: base64 zlib exc_string; '' otherwise),
--       exc_info (zlib), rq ttl (s), nx ('1': keep a stored answer), execution start (unix s)
--
-- Returns {finished, failed, requeued, late, {id, problem}...}: late = answered, but the claim had lapsed
-- (rq left as is); a problem = what could not be done as asked, and why (a retry whose count is no whole
-- number: failed instead; a job hash or rq result stream of a foreign type: not written).

local worker, now, iso = ARGV[1], number(ARGV[2]), ARGV[3]
local working, blob_ttl = number(ARGV[4]), integer(ARGV[5])
if not (now and working and blob_ttl and blob_ttl > 0) or (#ARGV - 5) % 10 ~= 0 then
  return redis.error_reply('finish: bad arguments')
end
local OUTCOMES = {finished = true, failed = true, retry = true, canceled = true}

-- 1. read and judge ---------------------------------------------------------------------------------
local wip_ok, queue_ok = usable(KEYS[2], 'zset'), usable(KEYS[1], 'list')
local finished_ok, failed_ok = usable(KEYS[3], 'zset'), usable(KEYS[4], 'zset')
local executions_ok, worker_ok = usable(KEYS[6], 'set'), usable(KEYS[5], 'hash')
if worker_ok then  -- its counters are incremented below: each must be a number already, or absent
  local c = redis.call('HMGET', KEYS[5], 'successful_job_count', 'failed_job_count', 'total_working_time')
  worker_ok = (not c[1] or integer(c[1]) ~= nil) and (not c[2] or integer(c[2]) ~= nil)
              and (not c[3] or number(c[3]) ~= nil)
end
local jobs, problems = {}, {}
for i = 6, #ARGV, 10 do
  local job = {id = ARGV[i], execution = ARGV[i + 1], outcome = ARGV[i + 2], blob = ARGV[i + 3],
               reply_to = ARGV[i + 4], payload = ARGV[i + 5], exc_info = ARGV[i + 6], ttl = integer(ARGV[i + 7]),
               nx = ARGV[i + 8] == '1', started = ARGV[i + 9]}
  if not valid_id(job.id) or not OUTCOMES[job.outcome] or not job.ttl or job.ttl <= 0 then
    return redis.error_reply('finish: bad arguments for job ' .. tostring(job.id))
  end
  job.member = job.id .. ':' .. job.execution
  job.claimed = job.outcome ~= 'canceled' and wip_ok and job.execution ~= ''
                and redis.call('ZSCORE', KEYS[2], job.member) ~= false
  if job.claimed and job.outcome == 'retry' then
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
  jobs[#jobs + 1] = job
end

-- 2. write --------------------------------------------------------------------------------------------
local ok, bad, requeued, late = 0, 0, 0, 0
local ended, finished, failed = {}, {}, {}

local function answer(job)
  if job.blob ~= '' then publish(job.id, job.blob, blob_ttl, job.nx, job.reply_to) end
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

local function end_execution(job)
  redis.call('DEL', EXECUTION .. job.member)
  redis.pcall('ZREM', EXECUTIONS .. job.id, job.execution)
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
    end_execution(job)
    set_job(job, 'status', 'finished', 'ended_at', iso)
    finished[#finished + 1] = now + job.ttl
    finished[#finished + 1] = job.id
    answer(job)
    ok = ok + 1
  else
    bad = bad + 1
    end_execution(job)
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
  bulk('ZREM', KEYS[2], ended)
  if executions_ok then bulk('SREM', KEYS[6], ended) end
end
if #finished > 0 and finished_ok then bulk('ZADD', KEYS[3], finished) end
if #failed > 0 and failed_ok then bulk('ZADD', KEYS[4], failed) end
if worker_ok then
  if ok > 0 then redis.call('HINCRBY', KEYS[5], 'successful_job_count', ok) end
  if bad > 0 then redis.call('HINCRBY', KEYS[5], 'failed_job_count', bad) end
  redis.call('HINCRBYFLOAT', KEYS[5], 'total_working_time', working)
end
local reply = {ok, bad - requeued, requeued, late}
for _, p in ipairs(problems) do reply[#reply + 1] = p end
return reply
