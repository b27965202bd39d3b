-- join.lua: add an agent (or one more replica of it) to a channel; create its consumer group.
--
-- KEYS[1] stream  KEYS[2] meta  KEYS[3] members  KEYS[4] parents
-- KEYS[5] status  KEYS[6] ids   KEYS[7] inbox    KEYS[8] beat
-- KEYS[9] marks   KEYS[10] idem: kept hash tables (keep_table), looked up a field at a time
-- ARGV[1] name   ARGV[2] parent name or id ("" for a root)   ARGV[3] parented: "1" if one was given
-- ARGV[4] id for a new agent   ARGV[5] replica (consumer name)   ARGV[6] host
-- ARGV[7] description   ARGV[8] skills (JSON array)   ARGV[9] lease (ms)
--
-- returns {0, code, message}  or  {1, id, depth, parent, status, created (0|1)}
--
-- The group is created at "$" inside this script, before the name can be addressed, so no
-- message to the agent can ever precede its group.

local stream, meta, members, parents, status, ids, inbox, beat, marks, idem =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local name, parent, parent_given, new_id = ARGV[1], ARGV[2], ARGV[3] == '1', ARGV[4]
local replica, host, description, skills, lease = ARGV[5], ARGV[6], ARGV[7], ARGV[8], tonumber(ARGV[9])

local m = redis.call('HMGET', meta, 'max_name_chars', 'max_depth', 'max_members')
if not m[1] then return {0, 'unknown_agent', 'no such channel'} end
local max_name, max_depth, max_members = tonumber(m[1]), tonumber(m[2] or '0'), tonumber(m[3] or '0')

local _, nchars = string.gsub(name, '[^\128-\191]', '')
if nchars == 0 or nchars > max_name or string.find(name, '%c') or string.find(name, '\194[\128-\159]')
  or name == 'all' or name == 'parent' or name == 'me' then
  return {0, 'invalid_input', 'bad agent name'}
end

local now = now_ms()

if parent ~= '' and redis.call('HEXISTS', parents, parent) == 0 then
  parent = redis.call('HGET', ids, parent) or parent
end

-- a member's stored record, or nil when a raw write left something else there
local function record(text)
  local ok, r = pcall(cjson.decode, text)
  if ok and type(r) == 'table' and type(r.id) == 'string' and type(r.depth) == 'number' then
    return r
  end
end
local function unreadable(who)
  return {0, 'invalid_input', 'the stored record of ' .. who .. ' is unreadable (a raw write): '
    .. 'remove it (ch.remove(name, force=True)) and join again'}
end

local rec = redis.call('HGET', members, name)
if rec then
  local r = record(rec)
  if not r then return unreadable(name) end
  if parent_given and parent ~= (r.parent or '') then
    return {0, 'invalid_input', name .. ' already joined with parent "' .. (r.parent or '') .. '"'}
  end
  -- statuses go one way: an ended agent takes no new replica; a completed one does (it may
  -- serve follow-ups) and stays completed
  local s = redis.call('HGET', status, name)
  if s == 'failed' or s == 'cancelled' or s == 'lost' then
    return {0, 'agent_closed', name .. ' is ' .. s}
  end
  if not s then -- (a member whose status went missing)
    soft('HSET', status, name, 'running')
    s = 'running'
  end
  -- one more replica needs no memory (a consumer restarting at maxmemory must drain)
  soft('HSET', beat, name .. '\n' .. replica, now + lease)
  keep_table(marks) -- (a channel a version before this one made)
  keep_table(idem)
  pcall(redis.call, 'XGROUP', 'CREATE', stream, name, '$', 'MKSTREAM')
  return {1, r.id, r.depth, r.parent or '', s, 0}
end

local depth = 0
if parent ~= '' then
  local prec = redis.call('HGET', members, parent)
  if not prec then return {0, 'unknown_agent', 'no such parent: ' .. parent} end
  local ps = redis.call('HGET', status, parent)
  if ps == 'failed' or ps == 'cancelled' then
    return {0, 'agent_closed', 'parent ' .. parent .. ' is ' .. ps}
  end
  local pr = record(prec)
  if not pr then return unreadable('parent ' .. parent) end
  depth = pr.depth + 1
end
if max_depth > 0 and depth > max_depth then
  return {0, 'budget', 'team depth budget: ' .. depth .. ' > ' .. max_depth}
end
if max_members > 0 and redis.call('HLEN', members) >= max_members then
  return {0, 'budget', 'team member budget spent: ' .. max_members}
end
if redis.call('HEXISTS', ids, new_id) == 1 then return {0, 'invalid_input', 'agent id taken'} end

local ok, sk = pcall(cjson.decode, skills)
if not ok or type(sk) ~= 'table' then sk = {} end
local record = {id = new_id, parent = parent, depth = depth, host = host,
  description = description, skills = sk, joined_ms = now}
pcall(redis.call, 'XGROUP', 'CREATE', stream, name, '$', 'MKSTREAM')
redis.call('HSET', members, name, cjson.encode(record))
redis.call('HSET', parents, name, parent)
redis.call('HSET', status, name, 'running')
redis.call('HSET', ids, new_id, name)
redis.call('HSETNX', inbox, name, 0)
keep_table(marks)
keep_table(idem)
-- every send, read mark, mark done and broadcast writes inbox depths, and every wake-up
-- reads and writes its agent's status: past a few members, hash tables (as_table) instead of
-- lists to scan
if redis.call('HLEN', inbox) > 16 then
  as_table(inbox)
  as_table(status)
end
redis.call('HSET', beat, name .. '\n' .. replica, now + lease)
return {1, new_id, depth, parent, 'running', 1}
