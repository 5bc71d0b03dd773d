-- join: one part of a spread request (worker/serving/spread.py) lands; the worker of the part that
-- completes the set combines them all, and a failed part fails the request once.
--
-- KEYS[1] embedfleet:chunks:<request>  HASH    HMGET plan/parts/failed/part:<k>..., HSET part:<k>/failed,
--                                              HINCRBY done (progress only), HGETALL (when complete)
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
local f = redis.call('HMGET', KEYS[1], 'plan', 'parts', 'failed', 'part:' .. index, 'done')
if not f[1] then return {-1} end
local parts = integer(f[2])
if not parts or parts < 1 or parts > 100000 or index >= parts then
  return {3, f[1], 'its part count is no whole number from 1 to 100000 above part ' .. index}
end

if ARGV[3] == '0' and not f[3] then
  redis.call('HSET', KEYS[1], 'failed', ARGV[2])
  f[3] = ARGV[2]
end
if f[3] then return {2, f[3], f[1]} end
if not f[4] then
  redis.call('HSET', KEYS[1], 'part:' .. index, ARGV[2])  -- a part run twice is stored once
  if not f[5] or integer(f[5]) then redis.call('HINCRBY', KEYS[1], 'done', 1) end
end
-- complete when every part is there (not by the `done` count, which only reports progress: a part field
-- planted by hand must not leave the request waiting for ever; its bytes fail the combination instead)
local names = {}
for k = 0, parts - 1 do names[#names + 1] = 'part:' .. k end
for start = 1, #names, 1000 do
  local present = redis.call('HMGET', KEYS[1], unpack(names, start, math.min(start + 999, #names)))
  for k = 1, #present do
    if not present[k] then return {0} end
  end
end
return {1, redis.call('HGETALL', KEYS[1])}
