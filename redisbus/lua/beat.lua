-- beat.lua: replicas' heartbeats and status changes, and the reaping of lost agents.
--
-- KEYS[1] beat  KEYS[2] status
-- ARGV[1] lease (ms)
-- ARGV[2..] triples: agent, replica, status to set ("" keeps it; only an open agent changes)
--
-- returns {agent, ...}: agents whose every replica's lease ran out (open ones only); the caller
-- reports each with outcome.lua "lost". A lost agent that beats again becomes "running".

local beat, status, lease = KEYS[1], KEYS[2], tonumber(ARGV[1])
local now = now_ms()
for i = 2, #ARGV, 3 do
  local agent, replica, want = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local s = redis.call('HGET', status, agent)
  if s then
    redis.call('HSET', beat, agent .. '\n' .. replica, now + lease)
    if s == 'lost' then redis.call('HSET', status, agent, 'running') end
    if want ~= '' and (s == 'running' or s == 'waiting' or s == 'idle' or s == 'completed') then
      redis.call('HSET', status, agent, want)
    end
  end
end

local alive, seen = {}, {}
local flat = redis.call('HGETALL', beat)
for i = 1, #flat, 2 do
  local agent = string.match(flat[i], '^(.-)\n')
  if agent then
    seen[agent] = true
    if tonumber(flat[i + 1]) >= now then alive[agent] = true end
  end
end
local lost = {}
for agent in pairs(seen) do
  if not alive[agent] then
    local s = redis.call('HGET', status, agent)
    if s == 'running' or s == 'waiting' or s == 'idle' then lost[#lost + 1] = agent end
  end
end
table.sort(lost)
return lost
