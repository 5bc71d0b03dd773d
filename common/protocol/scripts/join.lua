-- join: one part of a spread request (worker/serving/spread.py) lands; the worker of the part that
-- completes the set combines them all, and a failed part fails the request once.
--
-- KEYS[1] embedfleet:chunks:<request>  HASH    HGET plan/parts/done/failed, HSETNX part:<k>/failed,
--                                              HINCRBY done, HGETALL (when complete)
-- KEYS[2] embedfleet:result:<request>  STRING  EXISTS only: an answered request takes no more parts
-- ARGV: 1 part index, 2 the part's result blob (or, failed, the request's error blob), 3 '1' ok / '0' failed
-- Returns {0} (nothing to do), {-1} (no plan: expired, or not a spread request), {1, HGETALL} (complete:
-- combine and answer), {2, error blob, plan} (a part failed: answer the request with that error), {3,
-- plan, what} (the state holds what no worker writes: answer the request with that reason).

local index = integer(ARGV[1])
if not index or index < 0 then return redis.error_reply('join: bad arguments') end
if redis.call('EXISTS', KEYS[2]) == 1 then return {0} end
local state = kind(KEYS[1])
if state == 'none' then return {-1} end
if state ~= 'hash' then return {3, '', KEYS[1] .. ' is a ' .. state .. ', not a hash'} end
local f = redis.call('HMGET', KEYS[1], 'plan', 'parts', 'done', 'failed', 'part:' .. index)
if not f[1] then return {-1} end
local parts, done = integer(f[2]), f[3] and integer(f[3]) or 0
if not parts or parts < 1 or not done or index >= parts then
  return {3, f[1], 'its parts/done count is no whole number, or part ' .. index .. ' is out of range'}
end

if ARGV[3] == '0' and not f[4] then
  redis.call('HSET', KEYS[1], 'failed', ARGV[2])
  f[4] = ARGV[2]
end
if f[4] then return {2, f[4], f[1]} end
if not f[5] then
  redis.call('HSET', KEYS[1], 'part:' .. index, ARGV[2])
  done = redis.call('HINCRBY', KEYS[1], 'done', 1)
end
if done >= parts then return {1, redis.call('HGETALL', KEYS[1])} end
return {0}
