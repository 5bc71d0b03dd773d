-- batch collect: a runner records the answers of some lines, each once (HSETNX) and counted once,
-- only while its lease holds.
--
-- KEYS[1] embedfleet:batch:<id>:lease STRING (GET), KEYS[2] embedfleet:batch:<id>:lines HASH (HSETNX,
-- PEXPIRE), KEYS[3] embedfleet:batch:<id> HASH (HINCRBY completed / failed / input_tokens, PTTL)
-- ARGV: 1 lease token, then per line: index, counter (`completed` or `failed`), prompt tokens, the line
-- (stored with a first byte '1' for a 2xx answer, bound for the output file, '0' for the error file)
-- Returns how many lines were new (each counted once), -1 (the lease is not ours) or -2 (no batch).

if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
local ttl = redis.call('PTTL', KEYS[3])
if ttl == -2 then return -2 end
local added = 0
for i = 2, #ARGV, 4 do
  if redis.call('HSETNX', KEYS[2], ARGV[i], ARGV[i + 3]) == 1 then
    redis.call('HINCRBY', KEYS[3], ARGV[i + 1], 1)
    redis.call('HINCRBY', KEYS[3], 'input_tokens', ARGV[i + 2])
    added = added + 1
  end
end
if ttl > 0 then redis.call('PEXPIRE', KEYS[2], ttl) end
return added
