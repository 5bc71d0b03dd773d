-- in-flight release: a leader answered; each marker that still names it goes (its followers then read its
-- answer, or run on their own).
--
-- KEYS    embedfleet:inflight:<digest>...  STRING  GET (through pcall), DEL
-- ARGV    the id that led each marker, one per key
-- Returns the number of markers released.

local released = 0
for i, key in ipairs(KEYS) do
  if redis.pcall('GET', key) == ARGV[i] then
    redis.call('DEL', key)
    released = released + 1
  end
end
return released
