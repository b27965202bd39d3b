-- settle.lua: record what a replica did with entries it was handed (by a wait, a read, a claim).
--
-- KEYS[1] stream  KEYS[2] inbox  KEYS[3] marks  KEYS[4] status
-- ARGV[1] agent (its group)
-- ARGV[2..] pairs: op, entry id, where op is
--   "a"  acknowledge an entry not addressed to the agent (it only advanced the group cursor)
--   "r"  mark an entry addressed to the agent as read (it was returned to the agent in full)
--   "x"  expire an entry addressed to the agent whose ttl passed before delivery
--   "d"  mark an entry addressed to the agent done (control messages, consumed on sight)
--   "j:REASON"  reject an entry addressed to the agent that failed a check (signature, key,
--        time, addressing): acknowledge it, count the inbox down and mark it "J<ms>:REASON"
--        (its receipt says rejected)
--   "s"  set the agent's status to the value in place of the id ("running", "waiting",
--        "idle"), only while it is one of those: a closed or completed agent keeps its status
-- returns the number of ops that changed something
--
-- At maxmemory (noeviction) read marks and statuses are skipped (see soft in _prelude.lua):
-- acknowledging, expiring and rejecting still work, so consumers drain a full server.
--
-- The wait path sends this in front of its fetch (the blocking read of its bell, then
-- wake.lua), in one pipeline: the deferred ops of the calls before, so the wake-up never pays a
-- round trip for bookkeeping.

local stream, inbox, marks, status, agent = KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[1]
local now_s = nil -- the clock, as text (marks carry it so), read by the first op that needs it
local function clock_text()
  if not now_s then now_s = time_text(redis.call('TIME')) end
  return now_s
end
local changed = 0
-- set when an entry was rejected: an entry a raw XADD wrote (an attack) was never counted in,
-- so the count is kept, at the end, at least what the group still holds pending (repair.lua
-- gives the exact count)
local clamp = false

for i = 2, #ARGV, 2 do
  local op, id = ARGV[i], ARGV[i + 1]
  if op == 'a' then
    changed = changed + redis.call('XACK', stream, agent, id)
  elseif op == 'r' then
    changed = changed + (soft('HSETNX', marks, id .. '\n' .. agent, 'R' .. clock_text()) or 0)
  elseif op == 'x' or op == 'd' then
    if redis.call('XACK', stream, agent, id) == 1 then
      count_in(inbox, agent, -1)
      local t = clock_text()
      local mark = 'X' .. t
      if op == 'd' then mark = 'D' .. t .. ':' .. t .. ':' .. t .. ':' end
      redis.call('HSET', marks, id .. '\n' .. agent, mark)
      changed = changed + 1
    end
  elseif string.sub(op, 1, 2) == 'j:' then
    local n = reject(stream, inbox, marks, agent, id, string.sub(op, 3), clock_text())
    changed, clamp = changed + n, clamp or n == 1
  elseif op == 's' then
    local s = redis.call('HGET', status, agent)
    if (s == 'running' or s == 'waiting' or s == 'idle') and s ~= id then
      if soft('HSET', status, agent, id) then changed = changed + 1 end
    end
  end
end
if clamp then floor_pending(stream, inbox, agent) end
return changed
