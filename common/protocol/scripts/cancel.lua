-- cancel: a request still in its queue is taken out of it and answered "cancelled", all or nothing
-- against the workers (whose take reads the same list atomically): removing the id is the claim.
--
-- KEYS[1] rq:queue:<q>                   LIST    LPOS, LREM
-- KEYS[2] rq:canceled:<q>                ZSET    ZADD, ZREMRANGEBYSCORE (entries older than ARGV[5] go)
-- KEYS[3] embedfleet:queued_tokens:<q>   STRING  DECRBY the job's `tokens` (DEL if no whole number)
-- per id: rq:job:<id> HASH (HMGET tokens/options, HSET status), and publish's keys (lib.lua)
-- ARGV: 1 request id, 2 now (unix s), 3 the "cancelled" result blob, 4 result ttl (s),
--       5 how long a cancelled id stays in rq:canceled:<q> (s), 6 the request's reply stream ('' = none)
-- Returns 1 if the request was still queued and is now cancelled, else 0.

local id, now, blob, ttl, keep = ARGV[1], number(ARGV[2]), ARGV[3], integer(ARGV[4]), number(ARGV[5])
if not (valid_id(id) and now and ttl and ttl > 0 and keep) then return redis.error_reply('cancel: bad arguments') end
if not usable(KEYS[1], 'list') or redis.call('LPOS', KEYS[1], id) == false then return 0 end
local jobkey = JOB .. id
local hash = kind(jobkey) == 'hash'
local f = hash and redis.call('HMGET', jobkey, 'tokens', 'options') or {}
local tokens = hash and integer(f[1] or '0') or 0
local registry = usable(KEYS[2], 'zset')

redis.call('LREM', KEYS[1], 1, id)
if hash then redis.call('HSET', jobkey, 'status', 'canceled') end
if registry then
  redis.call('ZADD', KEYS[2], now, id)
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. (now - keep))  -- rq never cleans this registry
end
move_counter(KEYS[3], -math.max(tokens or 0, 0))
publish(id, blob, ttl, true, ARGV[6], f[2] ~= nil and f[2] ~= false)
expire_streams()
return 1
