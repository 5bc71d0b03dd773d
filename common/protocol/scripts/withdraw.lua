-- withdraw: a worker leaves: it is dropped from its model's workers (with any stale ones), and the model's
-- capabilities go only if no live worker is left. A script runs alone, and an advert is one MULTI/EXEC, so
-- this sees another worker's advert either whole (its ZADD: the key is kept) or not at all (its SET comes
-- after and recreates the key); never the SET without the ZADD.
--
-- KEYS[1] embedfleet:model:<name>          STRING  DEL
-- KEYS[2] embedfleet:model:<name>:workers  ZSET    ZREM, ZREMRANGEBYSCORE, ZCARD, DEL
-- ARGV: 1 worker name, 2 the oldest beat still alive (unix s)
-- Returns 1 if the capabilities were deleted (no worker left), else 0.

if not number(ARGV[2]) then return redis.error_reply('withdraw: bad arguments') end
if not usable(KEYS[2], 'zset') then
  redis.call('DEL', KEYS[2])
else
  redis.call('ZREM', KEYS[2], ARGV[1])
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ARGV[2])
  if redis.call('ZCARD', KEYS[2]) > 0 then return 0 end
end
redis.call('DEL', KEYS[1], KEYS[2])
return 1
