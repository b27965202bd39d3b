-- beat.lua: replicas' heartbeats and status changes, and the reaping of lost agents.
--
-- KEYS[1] beat  KEYS[2] status
-- ARGV[1] lease (ms)
-- ARGV[2] period: the caller's heartbeat period (ms): a gap between two beats of the channel longer
--         than one and a half of it is blindness
-- ARGV[3..] triples: agent, replica, status to set ("" keeps it; only an open agent changes)
--
-- returns {lost, mine}: lost = {agent, ...}, agents whose every replica was silent for a whole
-- lease while this channel was watched (open ones only); the caller reports each with
-- outcome.lua "lost". mine = {agent, status, live replicas, ...} for the triples' agents.
--
-- Silence is evidence only while somebody watched. The field "\n#judged" holds when a beat of
-- this channel last ran (the Redis clock). A gap longer than the grace since then means no
-- process of the channel could beat: Redis was down or restarting, failing over, out of
-- memory (every beat is refused there, this one's first write included), or every process was
-- cut off. Nobody saw the agents then, so that time does not count against them: every
-- deadline moves on by the gap less one heartbeat period (the time a beat takes to come round
-- counts as watched, so a channel whose only watcher always beats late still finds its dead).
-- A replica that died before or during the gap is still found within a lease of its last
-- beat, counting only watched time; a live one has the rest of its lease, at least the lease
-- less two periods, to beat again (a heartbeat retries soon after a failure).
--
-- One-way statuses: only an open agent (running, waiting, idle) changes status here; a
-- completed one keeps its lease (it may serve follow-ups) and its status; failed, cancelled
-- and lost agents are never renewed, and a lost agent stays lost.
--
-- A replica not seen for a whole lease past its deadline leaves the hash (after the agents it
-- made lost were found), so processes that come and go (per-process names) never pile up.

local beat, status, lease, period = KEYS[1], KEYS[2], tonumber(ARGV[1]), tonumber(ARGV[2])
local now = now_ms()
local judged = '\n#judged' -- no member's name holds a control character
local last = tonumber(redis.call('HGET', beat, judged) or '')
redis.call('HSET', beat, judged, now) -- the first write: refused at the memory limit
local shift = 0
if last and now - last > 1.5 * period then shift = now - last - period end

local mine, mine_at, renewed = {}, {}, {}
for i = 3, #ARGV, 3 do
  local agent, replica, want = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local s = redis.call('HGET', status, agent)
  if s == 'running' or s == 'waiting' or s == 'idle' or s == 'completed' then
    redis.call('HSET', beat, agent .. '\n' .. replica, now + lease)
    renewed[agent .. '\n' .. replica] = true
    if want ~= '' and want ~= s and s ~= 'completed' then
      redis.call('HSET', status, agent, want)
      s = want
    end
  end
  if not mine_at[agent] then
    mine[#mine + 1] = agent; mine[#mine + 1] = s or ''; mine[#mine + 1] = 0
    mine_at[agent] = #mine
  end
end

local alive, seen, gone = {}, {}, {}
local flat = redis.call('HGETALL', beat)
for i = 1, #flat, 2 do
  local agent = string.match(flat[i], '^([^\n]+)\n')
  if agent then
    seen[agent] = true
    local deadline = tonumber(flat[i + 1]) or 0
    if shift > 0 and not renewed[flat[i]] then
      deadline = deadline + shift
      redis.call('HSET', beat, flat[i], deadline)
    end
    if deadline >= now then
      alive[agent] = true
      local at = mine_at[agent]
      if at then mine[at] = mine[at] + 1 end
    elseif deadline < now - lease then gone[#gone + 1] = flat[i] end
  end
end
for i = 1, #gone, 1000 do
  redis.call('HDEL', beat, unpack(gone, i, math.min(#gone, i + 999)))
end
local lost = {}
for agent in pairs(seen) do
  if not alive[agent] then
    local s = redis.call('HGET', status, agent)
    if s == 'running' or s == 'waiting' or s == 'idle' then lost[#lost + 1] = agent end
  end
end
table.sort(lost)
return {lost, mine}
