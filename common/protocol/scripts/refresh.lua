-- refresh: renew a held round's leases (rq's maintain_heartbeats, for many jobs at once); never recreates
-- a claim that finish, recover (the lease had lapsed) or rq's maintenance already removed.
--
-- KEYS[1] rq:wip:<q>  ZSET  ZMSCORE, ZADD XX
-- per id, full only: rq:execution:<id>:<execution> HASH (HSET last_heartbeat, EXPIRE), rq:job:<id> HASH (HSET
--         last_heartbeat)
-- ARGV: 1 now (unix s), 2 now (rq time), 3 lease grace (s), 4 `lean` or `full` (what it records), then per
--       job: id, execution, lease (s)
-- Returns the number of claims renewed.

local grace, full = number(ARGV[3]), ARGV[4] == 'full'
if not grace or (#ARGV - 4) % 3 ~= 0 then return redis.error_reply('refresh: bad arguments') end
local claims = {}
for i = 5, #ARGV, 3 do
  local lease = number(ARGV[i + 2])
  if lease then claims[#claims + 1] = {id = ARGV[i], member = ARGV[i] .. ':' .. ARGV[i + 1], lease = lease} end
end
if #claims == 0 then return 0 end
local members = {}
for _, claim in ipairs(claims) do members[#members + 1] = claim.member end
local scores = {}
for k = 1, #members, 4000 do
  local part = redis.pcall('ZMSCORE', KEYS[1], unpack(members, k, math.min(k + 3999, #members)))
  if not wrote(part) then return 0 end  -- no zset: no claim to renew
  for j, score in ipairs(part) do scores[k + j - 1] = score end
end
local clock, renew = server_time(), {}
for i, claim in ipairs(claims) do
  if scores[i] then
    renew[#renew + 1] = clock + claim.lease + grace
    renew[#renew + 1] = claim.member
    if full then
      if kind(EXECUTION .. claim.member) == 'hash' then
        redis.call('HSET', EXECUTION .. claim.member, 'last_heartbeat', ARGV[1])
        redis.call('EXPIRE', EXECUTION .. claim.member, math.ceil(claim.lease + grace))
      end
      if kind(JOB .. claim.id) == 'hash' then redis.call('HSET', JOB .. claim.id, 'last_heartbeat', ARGV[2]) end
    end
  end
end
for k = 1, #renew, 4000 do
  redis.call('ZADD', KEYS[1], 'XX', unpack(renew, k, math.min(k + 3999, #renew)))
end
return #renew / 2
