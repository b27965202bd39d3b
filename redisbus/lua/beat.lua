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
--
-- The same few commands whatever the channel's size (more only past 1,000 fields a command):
-- the clock, the beat hash read whole, the statuses the call needs in one HMGET, one write of
-- the beat hash (the judging time, the renewed deadlines and the moved ones), and only when
-- there is something to do, one write of the status hash (the statuses that change) and one
-- drop of the replicas long gone. A replica's deadline renewed here counts as the hash holds
-- it after the write.

local beat, status, lease, period = KEYS[1], KEYS[2], tonumber(ARGV[1]), tonumber(ARGV[2])
local now, now_s = clock()
local due = string.format('%d', now + lease) -- a renewed deadline, as text: written once
local judged = '\n#judged' -- no member's name holds a control character
local flat = redis.call('HGETALL', beat)

-- the agents the call names, then those the hash holds a replica of (the agent of its i-th
-- field is fa[i]; those not alive are looked at for the lost), and the judging time
local names, nn, cur, fa, last = {}, 0, {}, {}, nil
for i = 3, #ARGV, 3 do
  local agent = ARGV[i]
  if cur[agent] == nil then cur[agent] = false; nn = nn + 1; names[nn] = agent end
end
for i = 1, #flat, 2 do
  local f = flat[i]
  local agent = string.match(f, '^([^\n]+)\n')
  fa[(i + 1) / 2] = agent or false
  if agent then
    if cur[agent] == nil then cur[agent] = false; nn = nn + 1; names[nn] = agent end
  elseif f == judged then
    last = tonumber(flat[i + 1])
  end
end
local shift = 0
if last and now - last > 1.5 * period then shift = now - last - period end
-- their statuses, in one look: cur[agent] is the status this call leaves (false: no member)
local got = chunked('HMGET', status, names, nn, 1000)
for k = 1, nn do cur[names[k]] = got[k] end

-- the writes, gathered: the judging time first (the first write: refused at the memory limit)
local put, np, set, ns = {judged, now_s}, 2, {}, 0
local mine, mine_at, renewed = {}, {}, {}
for i = 3, #ARGV, 3 do
  local agent, replica, want = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local s = cur[agent]
  if s == 'running' or s == 'waiting' or s == 'idle' or s == 'completed' then
    local f = agent .. '\n' .. replica
    if not renewed[f] then np = np + 2; put[np - 1], put[np] = f, due; renewed[f] = agent end
    if want ~= '' and want ~= s and s ~= 'completed' then
      ns = ns + 2; set[ns - 1], set[ns] = agent, want
      cur[agent], s = want, want
    end
  end
  if not mine_at[agent] then
    mine[#mine + 1] = agent; mine[#mine + 1] = s or ''; mine[#mine + 1] = 0
    mine_at[agent] = #mine
  end
end

-- every replica's deadline, as the hash holds it after the writes: live[agent] is true when
-- one is not past, false when all are
local live, gone = {}, {}
for i = 1, #flat, 2 do
  local agent = fa[(i + 1) / 2]
  if agent then
    local f = flat[i]
    local deadline
    if renewed[f] then
      renewed[f] = false -- (counted here: the hash held it)
      deadline = now + lease
    else
      deadline = tonumber(flat[i + 1]) or 0
      if shift > 0 then
        deadline = deadline + shift
        np = np + 2; put[np - 1], put[np] = f, deadline
      end
    end
    if deadline >= now then
      live[agent] = true
      local at = mine_at[agent]
      if at then mine[at] = mine[at] + 1 end
    else
      live[agent] = live[agent] or false
      if deadline < now - lease then gone[#gone + 1] = f end
    end
  end
end
for _, agent in pairs(renewed) do -- replicas the hash did not hold yet: live
  if agent then
    live[agent] = true
    local at = mine_at[agent]
    mine[at] = mine[at] + 1
  end
end
chunked('HSET', beat, put, np, 2000)
chunked('HSET', status, set, ns, 2000)
chunked('HDEL', beat, gone, #gone, 1000)
local lost = {}
for agent, alive in pairs(live) do
  if not alive then
    local s = cur[agent]
    if s == 'running' or s == 'waiting' or s == 'idle' then lost[#lost + 1] = agent end
  end
end
table.sort(lost)
return {lost, mine}
