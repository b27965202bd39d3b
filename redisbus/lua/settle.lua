-- settle.lua: record what a replica did with entries it fetched by a blocking XREADGROUP.
--
-- KEYS[1] stream  KEYS[2] inbox  KEYS[3] marks  KEYS[4] status
-- ARGV[1] agent (its group)
-- ARGV[2..] pairs: op, entry id, where op is
--   "a"  acknowledge an entry not addressed to the agent (it only advanced the group cursor)
--   "r"  mark an entry addressed to the agent as read (it was returned to the agent in full)
--   "x"  expire an entry addressed to the agent whose ttl passed before delivery
--   "d"  mark an entry addressed to the agent done (control messages, consumed on sight)
--   "s"  set the agent's status to the value in place of the id ("running", "waiting",
--        "idle"), only while it is one of those: a closed or completed agent keeps its status
--
-- returns the number of ops that changed something
--
-- The wait path sends this with its next XREADGROUP in one pipeline, so a wake-up never pays
-- a round trip for bookkeeping.

local stream, inbox, marks, status, agent = KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local changed = 0
for i = 2, #ARGV, 2 do
  local op, id = ARGV[i], ARGV[i + 1]
  if op == 'a' then
    changed = changed + redis.call('XACK', stream, agent, id)
  elseif op == 'r' then
    changed = changed + redis.call('HSETNX', marks, id .. '\n' .. agent, 'R' .. now)
  elseif op == 'x' or op == 'd' then
    if redis.call('XACK', stream, agent, id) == 1 then
      redis.call('HINCRBY', inbox, agent, -1)
      local mark = 'X' .. now
      if op == 'd' then mark = 'D' .. now .. ':' .. now .. ':' .. now .. ':' end
      redis.call('HSET', marks, id .. '\n' .. agent, mark)
      changed = changed + 1
    end
  elseif op == 's' then
    local s = redis.call('HGET', status, agent)
    if (s == 'running' or s == 'waiting' or s == 'idle') and s ~= id then
      redis.call('HSET', status, agent, id)
      changed = changed + 1
    end
  end
end
return changed
