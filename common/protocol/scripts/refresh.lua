-- refresh: renew a held round's leases (rq's maintain_heartbeats, for many jobs at once); never recreates
-- a claim that finish, recover (the lease had lapsed) or rq's maintenance already removed.
--
-- KEYS[1] rq:wip:<q>  ZSET  ZSCORE, ZADD XX
-- per id: rq:execution:<id>:<execution> HASH (HSET last_heartbeat, EXPIRE), rq:job:<id> HASH (HSET
--         last_heartbeat)
-- ARGV: 1 now (unix s), 2 now (rq time), 3 lease grace (s), then per job: id, execution, lease (s)
-- Returns the number of claims renewed.

local grace = number(ARGV[3])
if not grace or (#ARGV - 3) % 3 ~= 0 then return redis.error_reply('refresh: bad arguments') end
if not usable(KEYS[1], 'zset') then return 0 end
local clock, renew = server_time(), {}
for i = 4, #ARGV, 3 do
  local id, execution, lease = ARGV[i], ARGV[i + 1], number(ARGV[i + 2])
  local member = id .. ':' .. execution
  if lease and redis.call('ZSCORE', KEYS[1], member) then
    renew[#renew + 1] = {id = id, member = member, lease = lease,
                         execution = kind(EXECUTION .. member) == 'hash', job = kind(JOB .. id) == 'hash'}
  end
end
for _, claim in ipairs(renew) do
  redis.call('ZADD', KEYS[1], 'XX', clock + claim.lease + grace, claim.member)
  if claim.execution then
    redis.call('HSET', EXECUTION .. claim.member, 'last_heartbeat', ARGV[1])
    redis.call('EXPIRE', EXECUTION .. claim.member, math.ceil(claim.lease + grace))
  end
  if claim.job then redis.call('HSET', JOB .. claim.id, 'last_heartbeat', ARGV[2]) end
end
return #renew
