-- view.lua: the read and list calls: fetch new entries into the agent's group (read only),
-- select the messages a filter asks for, and mark the ones addressed to the agent as read.
--
-- KEYS[1] stream  KEYS[2] inbox  KEYS[3] marks  KEYS[4] nonces  KEYS[5] nonce times
--   (the replay record of settle.lua: "kid:nonce" -> first entry id, and when it was seen)
-- ARGV[1]  agent (its group)   ARGV[2] consumer (replica)
-- ARGV[3]  "1": fetch new entries first (read) — entries not addressed to the agent are
--          acknowledged at once, the others stay pending until done; "0": change nothing (list)
-- ARGV[4]  "1": mark returned messages addressed to the agent as read
-- ARGV[5]  exclusive lower bound entry id, or ""
-- ARGV[6]  limit (messages returned; 0 = only fetch)
-- ARGV[7]  "1": only unread messages addressed to the agent
-- ARGV[8]  from filter or ""   ARGV[9] to filter or ""   ARGV[10] subject filter (lower case) or ""
-- ARGV[11] scope: "board" (every message of the channel) or "own" (to or from the agent)
-- ARGV[12] replay horizon (ms) when signing is on, else "0": a signed entry whose (key, nonce)
--          an earlier entry carried is a copy: never shown; one fetched here is rejected
--          (acknowledged, counted down, marked "J<ms>:replay", as settle.lua does)
--
-- returns {now_ms, scanned, more, {id, {field, value, ...}, mark}, ...}
--   more is 1 when the fetch stopped at its cap (20000 entries) with entries left: call again
--   mark is "" (unread, or not addressed to the agent), "-" (not addressed to the agent),
--   or the receipt mark ("R..." read, "D..." done); rejected ("J...") entries are left out
--
-- Work is bounded: at most 20000 entries are fetched and 20000 scanned per call.

local stream, inbox, marks = KEYS[1], KEYS[2], KEYS[3]
local agent, consumer, pull, mark_read = ARGV[1], ARGV[2], ARGV[3] == '1', ARGV[4] == '1'
local after, limit, unread_only = ARGV[5], tonumber(ARGV[6]), ARGV[7] == '1'
local f_from, f_to, f_subject, scope = ARGV[8], ARGV[9], ARGV[10], ARGV[11]
local nonces, nonce_at, keep = KEYS[4], KEYS[5], tonumber(ARGV[12]) or 0
local now = now_ms()

local function expired(id, f)
  local ttl = field(f, 'x')
  if not ttl then return false end
  local ms = tonumber(string.match(id, '^(%d+)'))
  return ms + tonumber(ttl) * 1000 < now
end
local function expire(id)
  if redis.call('XACK', stream, agent, id) == 1 then
    redis.call('HINCRBY', inbox, agent, -1)
    redis.call('HSET', marks, id .. '\n' .. agent, 'X' .. now)
  end
end

-- a signed entry whose (key, nonce) an earlier entry carried (settle.lua's rule); with
-- `record`, remember this one as the first when no earlier one is known
local function copied(id, f, record)
  local sig = keep > 0 and field(f, 'g')
  return sig and seen_before(nonces, nonce_at, id, sig, now, record) or false
end
local function reject_copy(id)
  if redis.call('XACK', stream, agent, id) == 1 then
    -- a copy a raw XADD wrote was never counted in: never below what the group still holds
    -- pending (as settle.lua; repair.lua gives the exact count)
    local held = redis.call('XPENDING', stream, agent)[1]
    if redis.call('HINCRBY', inbox, agent, -1) < held then redis.call('HSET', inbox, agent, held) end
    redis.call('HSET', marks, id .. '\n' .. agent, 'J' .. now .. ':replay')
  end
end

local more = 0 -- 1: the fetch stopped at its cap with entries left (call again)
if pull then
  local fetched = 0
  while true do
    local r = redis.call('XREADGROUP', 'GROUP', agent, consumer, 'COUNT', 1000, 'STREAMS', stream, '>')
    local entries = {}
    if r and r[1] then
      -- Redis replies {{stream, entries}}; fakeredis (the test double) {stream, entries}
      entries = r[2]
      if type(r[1]) == 'table' then entries = r[1][2] end
    end
    local copies = {} -- rejected once the others' entries are acknowledged (see reject_copy)
    for _, e in ipairs(entries) do
      if not addressed(e[2], agent) then redis.call('XACK', stream, agent, e[1])
      elseif expired(e[1], e[2]) then expire(e[1])
      elseif copied(e[1], e[2], true) then copies[#copies + 1] = e[1] end
    end
    for _, id in ipairs(copies) do reject_copy(id) end
    fetched = fetched + #entries
    if #entries < 1000 then break end
    if fetched >= 20000 then more = 1 break end
  end
end
if limit == 0 then return {now, 0, more} end

-- where to start (XRANGE bound): after an id (exclusive), or for unread messages at the
-- oldest pending entry (inclusive) or, with nothing pending, just after the group cursor
local cursor = nil
if after ~= '' then cursor = '(' .. after end
if unread_only and not cursor then
  local low = redis.call('XPENDING', stream, agent)[2]
  if not low and not pull then
    for _, g in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
      local name, last
      for i = 1, #g, 2 do
        if g[i] == 'name' then name = g[i + 1] elseif g[i] == 'last-delivered-id' then last = g[i + 1] end
      end
      if name == agent then low = '(' .. last end
    end
  end
  if not low then return {now, 0, more} end
  cursor = low
end

local out = {now, 0, more}
local scanned, found = 0, 0
local function consider(e)
  local id, f = e[1], e[2]
  scanned = scanned + 1
  local mine = addressed(f, agent)
  local from = field(f, 'f')
  if scope == 'own' and not mine and from ~= agent then return end
  if f_from ~= '' and from ~= f_from then return end
  if f_to ~= '' and not addressed(f, f_to) then return end
  if f_subject ~= '' then
    local s = string.lower(field(f, 's') or '')
    if not string.find(s, f_subject, 1, true) then return end
  end
  local mk = '-'
  if mine then
    mk = redis.call('HGET', marks, id .. '\n' .. agent) or ''
    local m1 = string.sub(mk, 1, 1)
    if m1 == 'X' or m1 == 'F' or m1 == 'J' then return end
    if mk == '' and expired(id, f) then
      if mark_read then expire(id) end
      return
    end
  end
  if unread_only and mk ~= '' then return end
  if copied(id, f, false) then
    if mine and mark_read then reject_copy(id) end
    return
  end
  if mine and mark_read and mk == '' then
    redis.call('HSET', marks, id .. '\n' .. agent, 'R' .. now)
  end
  out[#out + 1] = {id, f, mk}
  found = found + 1
end

if not cursor then
  -- newest `limit` messages, returned oldest first
  local cursor, picked = '+', {}
  while found < limit and scanned < 20000 do
    local batch = redis.call('XREVRANGE', stream, cursor, '-', 'COUNT', 200)
    if #batch == 0 then break end
    for _, e in ipairs(batch) do
      if found >= limit then break end
      local before = #out
      consider(e)
      if #out > before then picked[#picked + 1] = table.remove(out) end
    end
    cursor = '(' .. batch[#batch][1]
    if #batch < 200 then break end
  end
  for i = #picked, 1, -1 do out[#out + 1] = picked[i] end
else
  while found < limit and scanned < 20000 do
    local batch = redis.call('XRANGE', stream, cursor, '+', 'COUNT', 200)
    if #batch == 0 then break end
    for _, e in ipairs(batch) do
      if found >= limit then break end
      consider(e)
    end
    cursor = '(' .. batch[#batch][1]
    if #batch < 200 then break end
  end
end
out[2] = scanned
return out
