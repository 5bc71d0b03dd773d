-- lib: helpers every script is built with (scripts.py puts this file before each one).
--
-- Everything read from Redis is input, and a script must never stop half-way (Lua does not roll back what
-- it wrote). Two habits keep them whole: a value a script computes with (a count, a status, a TTL) is read
-- and judged before its first write; and a write to a key that others may write too (a notify list, a
-- reply stream, rq's result stream, a job's executions) goes through pcall, so that a key of a foreign
-- type costs that one write, never the script.
--
-- Key prefixes and limits are filled in from common/protocol/keys.py, rqkeys.py and common/names.py when the
-- scripts are loaded (double-braced names: common/protocol/scripts.py).

local RESULT, NOTIFY, OPTIONS = '{{RESULT_PREFIX}}', '{{NOTIFY_PREFIX}}', '{{JOB_OPTIONS_PREFIX}}'
local JOB, EXECUTION, EXECUTIONS = '{{RQ_JOB_PREFIX}}', '{{RQ_EXECUTION_PREFIX}}', '{{RQ_EXECUTIONS_PREFIX}}'
local RESULTS, WORKER, CHUNKS = '{{RQ_RESULTS_PREFIX}}', '{{RQ_WORKER_PREFIX}}', '{{CHUNKS_PREFIX}}'
local REPLY_MAXLEN, MAX_ID = tonumber('{{REPLY_STREAM_MAXLEN}}'), tonumber('{{MAX_REQUEST_ID_LENGTH}}')
local MAX_TAG = tonumber('{{MAX_TAG_LENGTH}}')

-- a finite number, or nil
local function number(value)
  local n = tonumber(value)
  if n == nil or n ~= n or n == math.huge or n == -math.huge then return nil end
  return n
end

-- a whole number written as one (what HINCRBY / INCRBY accept), or nil
local function integer(value)
  if type(value) ~= 'string' or #value > 15 or not string.match(value, '^%-?%d+$') then return nil end
  return tonumber(value)
end

-- the key's type: 'none', 'string', 'hash', 'list', 'set', 'zset', 'stream'
local function kind(key)
  return redis.call('TYPE', key)['ok']
end

-- true if `key` is absent or of the type `wanted`: the only keys a script writes to
local function usable(key, wanted)
  local t = kind(key)
  return t == wanted or t == 'none'
end

-- an id that can name a request (and so an rq job): rq's alphabet, at most MAX_ID characters, after an
-- optional hash tag of at most MAX_TAG of them in braces (Redis Cluster: keys.py)
local function valid_id(id)
  if type(id) ~= 'string' then return false end
  local tag, rest = string.match(id, '^(%b{})(.*)$')
  if tag then
    if #tag > MAX_TAG + 2 or not string.match(tag, '^{[%w_%-]+}$') then return false end
    id = rest
  end
  return #id > 0 and #id <= MAX_ID and string.match(id, '^[%w_%-]+$') ~= nil
end

-- the server's clock: leases are compared on one clock, whatever the workers' clocks say
local function server_time()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end

-- one multi-member command per batch (in chunks, within Lua's unpack limit): `args` after the key
local function bulk(command, key, args)
  for i = 1, #args, 4000 do
    redis.call(command, key, unpack(args, i, math.min(i + 3999, #args)))
  end
end

-- true unless `reply` is the error of a redis.pcall (a write refused: a key of a foreign type, say)
local function wrote(reply)
  return type(reply) ~= 'table' or reply['err'] == nil
end

-- `bulk` through pcall: false if the key refused it (a foreign type refuses the first chunk: none got in)
local function pbulk(command, key, args)
  for i = 1, #args, 4000 do
    if not wrote(redis.pcall(command, key, unpack(args, i, math.min(i + 3999, #args)))) then return false end
  end
  return true
end

-- The one way an answer becomes visible, whichever way its request ended (served, failed, cancelled,
-- expired, poison, joined): the result blob and one wake-up, on the path its request waits on: its reply
-- stream (an AsyncProducer's waiters, `reply_to`) or else its notify list (BLPOP / BLMOVE waiters), never
-- both; and the gateway job's options, when the job says it has some (`options`), now expire with the
-- result. nx: keep an answer already stored (the first answer stays). Producers may write the notify list
-- and reply streams, so those writes go through pcall: a key of a foreign type (or a stream whose last id
-- is the largest possible one) loses that one wake-up, never the script. A reply stream gets its TTL once
-- per script (expire_streams), however many of its requests the script answers.
local streams = {}

-- the wake-up half of publish, for a blob stored just before (finish: a served answer's blob is SET by the
-- same pipeline, outside Lua, which would copy it twice)
local function wake(id, ttl, reply_to, options)
  if reply_to and reply_to ~= '' then
    if wrote(redis.pcall('XADD', reply_to, 'MAXLEN', '~', REPLY_MAXLEN, '*', 'id', id)) then
      streams[reply_to] = math.max(streams[reply_to] or 0, ttl)
    end
  elseif wrote(redis.pcall('RPUSH', NOTIFY .. id, 1)) then
    redis.call('EXPIRE', NOTIFY .. id, ttl)
  end
  if options then redis.call('EXPIRE', OPTIONS .. id, ttl) end
end

local function publish(id, blob, ttl, nx, reply_to, options)
  if nx then
    redis.call('SET', RESULT .. id, blob, 'EX', ttl, 'NX')
  else
    redis.call('SET', RESULT .. id, blob, 'EX', ttl)
  end
  wake(id, ttl, reply_to, options)
end

-- the TTL of every reply stream this script published to (call once, after the last publish)
local function expire_streams()
  for stream, ttl in pairs(streams) do redis.call('EXPIRE', stream, ttl) end
end

-- a queue's estimated-tokens counter moved by `delta` (producers add, takers subtract: an estimate). One
-- that holds no whole number or is of a foreign type (the INCRBY is refused), or would drop below zero, is
-- reset: deleted, then given a positive `delta`.
local function move_counter(key, delta)
  if delta == 0 then return end
  local left = redis.pcall('INCRBY', key, delta)
  if type(left) ~= 'number' or left < 0 then
    redis.call('DEL', key)
    if delta > 0 then redis.call('INCRBY', key, delta) end
  end
end
