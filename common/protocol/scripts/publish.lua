-- publish: an answer written outside a worker's claim (lib's publish, the one way an answer becomes
-- visible): rq's maintenance failing an abandoned job, a spread request answered from its parts.
--
-- KEYS[1] (optional) embedfleet:chunks:<id>  HASH  DEL: the spread request's join state, done with
-- per id: publish's keys (lib.lua)
-- ARGV: 1 request id, 2 result blob, 3 result ttl (s), 4 nx ('1': keep an answer already stored),
--       5 the request's reply stream ('' = none)
-- Returns 1.

local id, blob, ttl = ARGV[1], ARGV[2], integer(ARGV[3])
if not (valid_id(id) and ttl and ttl > 0 and blob ~= '') then return redis.error_reply('publish: bad arguments') end
if KEYS[1] then redis.call('DEL', KEYS[1]) end
publish(id, blob, ttl, ARGV[4] == '1', ARGV[5], true)  -- a rare path: the options key, if any, goes too
expire_streams()
return 1
