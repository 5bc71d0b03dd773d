-- save options: the HTTP gateway keeps how to answer an async job (encoding, webhook, owner) until its
-- result expires. The job is enqueued before its options are saved, so its result may already be there:
-- then the options take the result's remaining time, not a fresh full TTL.
--
-- KEYS[1] embedfleet:job:<id>     STRING  SET EX, PEXPIRE
-- KEYS[2] embedfleet:result:<id>  STRING  PTTL
-- ARGV: 1 the options (JSON), 2 ttl while the job waits (s)
-- Returns 1.

redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
local left = redis.call('PTTL', KEYS[2])
if left > 0 then redis.call('PEXPIRE', KEYS[1], left) end
return 1
