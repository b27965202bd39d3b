-- remove.lua: take an agent off a channel, freeing its name (a new join makes a new member).
--
-- KEYS[1] stream  KEYS[2] members  KEYS[3] parents  KEYS[4] status
-- KEYS[5] ids     KEYS[6] inbox    KEYS[7] beat     KEYS[8] bell: the agent's
-- KEYS[9] wakeup: the agent's (what its waits block on)
-- ARGV[1] agent name   ARGV[2] force: "1" to remove it even while it holds work
--
-- returns {0, code, message}   refused: unknown_agent, or not_permitted while it holds work
--      or {1, undone, pending, open children}   the work it held (non-zero only when forced)
--
-- Work is what the removal would drop: undone messages addressed to it (its inbox counter),
-- entries its consumer group holds pending, children still open (running, waiting, idle),
-- and a replica still beating (a live process whose next wait would find no group). A failed,
-- cancelled or lost agent will never do its undone messages: they are not work it holds, so
-- removing it (to use its name again) needs no force unless it has open children. Forced,
-- the group and its pending entries go; the entries stay in the stream for the other
-- recipients, and the janitor trims them as usual. Its children keep its name as their
-- parent: a later member of that name is their parent again.

local stream, members, parents, status, ids, inbox, beat, bell, wakeup =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local name, force = ARGV[1], ARGV[2] == '1'

local rec = redis.call('HGET', members, name)
if not rec then return {0, 'unknown_agent', 'no such member: ' .. name} end

local s = redis.call('HGET', status, name)
local ended = s == 'failed' or s == 'cancelled' or s == 'lost'
local undone = tonumber(redis.call('HGET', inbox, name) or '0') or 0
local pending = 0
local ok, summary = pcall(redis.call, 'XPENDING', stream, name)
if ok and type(summary) == 'table' then pending = tonumber(summary[1]) or 0 end
if ended then undone, pending = 0, 0 end
local open = {}
local flat = redis.call('HGETALL', parents)
for i = 1, #flat, 2 do
  if flat[i + 1] == name then
    local s = redis.call('HGET', status, flat[i])
    if s == 'running' or s == 'waiting' or s == 'idle' then open[#open + 1] = flat[i] end
  end
end
local now = now_ms()
local replicas, live = {}, 0
local prefix = name .. '\n'
flat = redis.call('HGETALL', beat)
for i = 1, #flat, 2 do
  if string.sub(flat[i], 1, #prefix) == prefix then
    replicas[#replicas + 1] = flat[i]
    if (tonumber(flat[i + 1]) or 0) >= now and (s == 'running' or s == 'waiting' or s == 'idle') then
      live = live + 1
    end
  end
end

if not force and (undone > 0 or pending > 0 or #open > 0 or live > 0) then
  local why = {}
  if undone > 0 then why[#why + 1] = undone .. ' undone message(s)' end
  if pending > 0 then why[#why + 1] = pending .. ' pending entr(ies)' end
  if #open > 0 then why[#why + 1] = 'open children: ' .. table.concat(open, ', ') end
  if live > 0 then why[#why + 1] = live .. ' live replica(s)' end
  return {0, 'not_permitted', name .. ' holds work (' .. table.concat(why, '; ') ..
    '): remove(force=True) drops it'}
end

pcall(redis.call, 'XGROUP', 'DESTROY', stream, name)
redis.call('DEL', bell, wakeup)
local okj, r = pcall(cjson.decode, rec)
if okj and type(r) == 'table' and type(r.id) == 'string' and redis.call('HGET', ids, r.id) == name then
  redis.call('HDEL', ids, r.id)
end
redis.call('HDEL', members, name)
redis.call('HDEL', parents, name)
redis.call('HDEL', status, name)
redis.call('HDEL', inbox, name)
chunked('HDEL', beat, replicas, #replicas, 1000)
return {1, undone, pending, #open}
