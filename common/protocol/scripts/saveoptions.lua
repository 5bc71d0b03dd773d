-- save options: the HTTP gateway keeps how to answer an async job (encoding, webhook, owner) until its
-- result expires. The job is enqueued before its options are saved, so its result may already be there:
-- then the options take the result's remaining time, not a fresh full TTL. Otherwise its job is marked
-- (`options`): the worker's answer gives them the result's TTL (lib.lua `publish`), and no other answer
-- pays that EXPIRE. A job taken before the mark keeps its options their full time (they expire by
-- themselves).
--
-- KEYS[1] embedfleet:job:<id>     STRING  SET EX, PEXPIRE
-- KEYS[2] embedfleet:result:<id>  STRING  PTTL
-- KEYS[3] rq:job:<id>             HASH    HSET options 1 (only when it is a hash)
-- ARGV: 1 the options (JSON), 2 ttl while the job waits (s)
-- Returns 1.

redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
local left = redis.call('PTTL', KEYS[2])
if left > 0 then
  redis.call('PEXPIRE', KEYS[1], left)
elseif KEYS[3] and kind(KEYS[3]) == 'hash' then
  redis.call('HSET', KEYS[3], 'options', '1')
end
return 1
