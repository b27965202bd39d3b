-- lease.lua: keep entries a replica is still handling from being reclaimed (a long turn):
-- each one's idle time reset, without counting a delivery, only while this replica holds it.
--
-- KEYS[1] stream
-- ARGV[1] agent (its group)   ARGV[2] consumer (the replica)   ARGV[3..] entry ids
--
-- returns the number of entries extended: those pending for `consumer` in `agent`'s group. An
-- entry another replica took back once its lease ran out is that replica's now, and one done
-- or dead-lettered is no one's: both are left alone (a lease is never taken back).

local stream, agent, consumer = KEYS[1], ARGV[1], ARGV[2]
local n = 0
for i = 3, #ARGV do
  local id = ARGV[i]
  local p = redis.call('XPENDING', stream, agent, id, id, 1)[1]
  if p and p[2] == consumer then
    redis.call('XCLAIM', stream, agent, consumer, 0, id, 'JUSTID')
    n = n + 1
  end
end
return n
