-- batch lease: a runner renews or releases its claim on a batch, only if the claim is its own.
--
-- KEYS[1] embedfleet:batch:<id>:lease STRING; ARGV: 1 token, 2 lease (ms), 3 '1' = renew, '0' = release

if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[3] == '1' then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return redis.call('DEL', KEYS[1])
