-- delete.lua: delete a channel: every key it has (the registry entry is the caller's).
--
-- KEYS[1] meta  KEYS[2] status  KEYS[3] inbox  KEYS[4] beat
-- KEYS[5..] rest: every other key of the channel (stream, members, ... : ChannelKeys, all of
--           them) and the members' doorbells and wakeup lists
-- ARGV[1] force: "1" to delete it even while it is in use
--
-- returns {0, code, message}   refused: unknown_channel, or not_permitted while in use
--      or {1, keys deleted}
--
-- In use: an undone message (an inbox counter above 0), or an open member (running,
-- waiting, idle) with a replica still beating. An empty channel, or one whose agents all
-- ended or left, goes without force.

local meta, status, inbox, beat = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local force = ARGV[1] == '1'

if redis.call('EXISTS', meta) == 0 then return {0, 'unknown_channel', 'no such channel'} end

if not force then
  local undone = 0
  local flat = redis.call('HGETALL', inbox)
  for i = 2, #flat, 2 do undone = undone + (tonumber(flat[i]) or 0) end
  local now, live = now_ms(), {}
  flat = redis.call('HGETALL', beat)
  for i = 1, #flat, 2 do
    local agent = string.match(flat[i], '^([^\n]+)\n')
    if agent and not live[agent] and (tonumber(flat[i + 1]) or 0) >= now then
      local s = redis.call('HGET', status, agent)
      if s == 'running' or s == 'waiting' or s == 'idle' then live[agent] = true end
    end
  end
  local names = {}
  for agent in pairs(live) do names[#names + 1] = agent end
  table.sort(names)
  if undone > 0 or #names > 0 then
    local why = {}
    if undone > 0 then why[#why + 1] = undone .. ' undone message(s)' end
    if #names > 0 then why[#why + 1] = 'live agents: ' .. table.concat(names, ', ') end
    return {0, 'not_permitted', 'the channel is in use (' .. table.concat(why, '; ') ..
      '): delete(force=True) deletes it anyway'}
  end
end

local n = 0
for i = 1, #KEYS do n = n + redis.call('DEL', KEYS[i]) end
return {1, n}
