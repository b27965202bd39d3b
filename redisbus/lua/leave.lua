-- leave.lua: undo a join that nothing has used: the member, its consumer group and its
-- heartbeat go again, and its name is free, as if it had never joined.
--
-- KEYS[1] stream  KEYS[2] members  KEYS[3] parents  KEYS[4] status
-- KEYS[5] ids     KEYS[6] inbox    KEYS[7] beat     KEYS[8] bell: the agent's
-- KEYS[9] wakeup: the agent's (what its waits block on)
-- ARGV[1] agent: its name   ARGV[2] id: the agent id its join returned
-- ARGV[3] replica: its replica
--
-- returns {1, ''}   the join is undone
--      or {0, why}  something happened since the join, and the member stays as it is
--
-- Nothing happened means: the member is still the one that join made (same id: it was not
-- removed and joined anew), it is still running (not ended, not waiting), no message to it is
-- undone, its group holds no pending entry, it has no child, and no other replica of it
-- beats (another process attached to it). The checks and the removal are one script, so
-- nothing can slip in between them.

local stream, members, parents, status, ids, inbox, beat, bell, wakeup =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local name, id, replica = ARGV[1], ARGV[2], ARGV[3]

local rec = redis.call('HGET', members, name)
if not rec then return {0, 'not a member'} end
local ok, r = pcall(cjson.decode, rec)
if not ok or type(r) ~= 'table' or r.id ~= id then return {0, 'joined again'} end
local s = redis.call('HGET', status, name)
if s ~= 'running' then return {0, 'status ' .. tostring(s)} end
if (tonumber(redis.call('HGET', inbox, name) or '0') or 0) > 0 then
  return {0, 'undone messages'}
end
local okp, summary = pcall(redis.call, 'XPENDING', stream, name)
if okp and type(summary) == 'table' and (tonumber(summary[1]) or 0) > 0 then
  return {0, 'pending entries'}
end
local flat = redis.call('HGETALL', parents)
for i = 2, #flat, 2 do
  if flat[i] == name then return {0, 'has children'} end
end
local own = name .. '\n' .. replica
local prefix = name .. '\n'
flat = redis.call('HGETALL', beat)
for i = 1, #flat, 2 do
  if string.sub(flat[i], 1, #prefix) == prefix and flat[i] ~= own then
    return {0, 'another replica'}
  end
end

pcall(redis.call, 'XGROUP', 'DESTROY', stream, name)
redis.call('DEL', bell, wakeup)
if redis.call('HGET', ids, id) == name then redis.call('HDEL', ids, id) end
redis.call('HDEL', members, name)
redis.call('HDEL', parents, name)
redis.call('HDEL', status, name)
redis.call('HDEL', inbox, name)
redis.call('HDEL', beat, own)
return {1, ''}
