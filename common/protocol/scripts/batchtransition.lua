-- batch transition: a batch's status changes only from the statuses the change allows, and
-- (for a runner) only while its lease holds; a batch that ends leaves the active index and loses its work keys.
--
-- KEYS[1] embedfleet:batch:<id> HASH (HGET status, HSET), KEYS[2] embedfleet:batches:active ZSET (ZREM on
-- an end), KEYS[3] embedfleet:batch:<id>:lease STRING (GET; DEL on an end), KEYS[4..] keys deleted on an end
-- ARGV: 1 batch id, 2 lease token ('' = no lease needed: a route), 3 the statuses it may change from (space-
-- separated), 4 the new status, 5 '1' = the batch ends, 6.. field/value pairs set with it
-- Returns {1} (changed), {0, status} (its status was another), {-1} (the lease is not ours), {-2} (no batch).

if ARGV[2] ~= '' and redis.call('GET', KEYS[3]) ~= ARGV[2] then return {-1} end
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return {-2} end
if not string.find(' ' .. ARGV[3] .. ' ', ' ' .. status .. ' ', 1, true) then return {0, status} end
redis.call('HSET', KEYS[1], 'status', ARGV[4], unpack(ARGV, 6))
if ARGV[5] == '1' then
  redis.call('ZREM', KEYS[2], ARGV[1])
  redis.call('DEL', unpack(KEYS, 3))
end
return {1}
