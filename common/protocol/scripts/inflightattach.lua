-- in-flight attach: identical requests computed once across the fleet (worker/serving/inflight.py). For each
-- marker of a round: this request leads it (the marker names it now) or follows the request it names.
-- A marker whose leader already has a result is taken over: that answer is final, and the cache holds its
-- vectors. Atomic with the leader's publish-then-release (finish), so no follower attaches to a leader whose
-- followers were already let go.
--
-- KEYS    embedfleet:inflight:<digest>...  STRING  GET (through pcall: a key of a foreign type is taken over),
--                                                 SET EX (which replaces a key of any type)
-- per leader: embedfleet:result:<leader id> (EXISTS)
-- ARGV: 1 marker ttl (s), then one request id per key
-- Returns per key: '' (this request leads) or the leader's id (it follows). A marker that is no string, or
-- names no request id, is taken over too.

local ttl = integer(ARGV[1])
if not ttl or ttl <= 0 or #ARGV ~= #KEYS + 1 then return redis.error_reply('inflight attach: bad arguments') end
local out = {}
for i, key in ipairs(KEYS) do
  local me = ARGV[i + 1]
  local leader = redis.pcall('GET', key)
  if type(leader) == 'string' and leader ~= me and valid_id(leader) and redis.call('EXISTS', RESULT .. leader) == 0 then
    out[i] = leader
  else
    redis.call('SET', key, me, 'EX', ttl)
    out[i] = ''
  end
end
return out
