-- view.lua: the read and list calls: fetch new entries into the agent's group (read only),
-- select the messages a filter asks for, and mark the ones addressed to the agent as read.
--
-- KEYS[1] stream  KEYS[2] inbox  KEYS[3] marks  KEYS[4] nonces  KEYS[5] nonce_at (nonce times)
--   (the replay record of settle.lua: "kid:nonce" -> first entry id, and when it was seen)
-- KEYS[6] dlq  KEYS[7] rate  KEYS[8] meta (a read past max_deliveries dead-letters, as
--   claim.lua does)
-- KEYS[9] bell: the agent's doorbell; what a read fetches is no longer for its waits to take
-- KEYS[10] wakeup: the agent's (it goes with the last id of the bell)
-- ARGV[1]  agent (its group)   ARGV[2] consumer (replica)
-- ARGV[3]  pull: "1" to fetch new entries first (read) — entries not addressed to the agent are
--          acknowledged at once, the others stay pending until done; "0": change nothing (list)
-- ARGV[4]  mark: "1" to mark returned messages addressed to the agent as read
-- ARGV[5]  since: exclusive lower bound entry id, or ""
-- ARGV[6]  limit (messages returned; 0 = only fetch)
-- ARGV[7]  unread: "1" for only unread messages addressed to the agent
-- ARGV[8]  from filter or ""   ARGV[9] to filter or ""
-- ARGV[10] subject filter or "": one group per character of the filter text, groups separated
--          by "\n", each the forms that character may take ("\t" between them: its lower,
--          upper, title and case-folded forms), so case folding is Python's, not Lua's ASCII one
-- ARGV[11] scope: "board" (every message of the channel) or "own" (to or from the agent)
-- ARGV[12] keep: the replay horizon (ms) with signing on, else "0": a signed entry whose (key, nonce)
--          an earlier entry carried is a copy: never shown; one fetched here is rejected
--          (acknowledged, counted down, marked "J<ms>:replay", as settle.lua does)
-- ARGV[13] resume token of the previous call's reply, or "" (or absent) to start
--
-- returns {now_ms, scanned, more, resume, {id, {field, value, ...}, mark}, ...}
--   more is 1 when the fetch stopped at its cap (20000 entries) with entries left
--   resume is "" when the selection is complete (or the limit reached); else call again with
--   it (and the limit lowered by what came back): the walk stopped at its cap of 20000 entries
--   ("p", "n", "f" tokens: later entries follow; "v": earlier ones, newest-first scans), or
--   the fetch did ("a": fetch more, then select again)
--   mark is "" (unread, or not addressed to the agent), "-" (not addressed to the agent),
--   or the receipt mark ("R..." read, "D..." done); rejected ("J...") entries are left out;
--   handed is, for read (ARGV[4] "1"), how many times the message was handed to the agent,
--   this read included (0: not one it holds: done, or not addressed to it)
--
-- A read hands out what it returns as a wait does: an entry addressed to the agent and not
-- done is claimed by this replica (its lease starts again) with its hand-out count one up
-- (claim.lua's count); one already handed out max_deliveries times is dead-lettered instead
-- of returned. At maxmemory (noeviction) read marks are skipped, as in settle.lua.
--
-- Unread messages are found without walking the stream: they are the group's pending entries
-- not marked read (looked up by id from XPENDING, 200 at a time, their marks read by one HMGET
-- a page: what the agent holds read and not done costs a read no command each), then, for
-- list (no fetch), the entries after
-- the group's cursor. So a read costs the same however many entries lie behind an old pending
-- one. Work is bounded: at most 20000 entries fetched and 20000 examined per call.

local stream, inbox, marks = KEYS[1], KEYS[2], KEYS[3]
local dlq, rate, meta, bell, wakeup = KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local agent, consumer, pull, mark_read = ARGV[1], ARGV[2], ARGV[3] == '1', ARGV[4] == '1'
local after, limit, unread_only = ARGV[5], tonumber(ARGV[6]), ARGV[7] == '1'
local f_from, f_to, f_subject, scope = ARGV[8], ARGV[9], ARGV[10], ARGV[11]
local nonces, nonce_at, keep = KEYS[4], KEYS[5], tonumber(ARGV[12]) or 0
local resume = ARGV[13] or ''
local CAP = 20000
local now = now_ms()

local function expired(id, f)
  local ttl = ttl_of(field(f, 'x'))
  if not ttl then return false end
  local ms = tonumber(string.match(id, '^(%d+)'))
  return ms + ttl * 1000 < now
end
local function expire(id)
  if redis.call('XACK', stream, agent, id) == 1 then
    count_in(inbox, agent, -1)
    redis.call('HSET', marks, id .. '\n' .. agent, 'X' .. now)
  end
end
local function later(a, b) -- the later of two ids, either may be ""
  if a == '' then return b end
  if b == '' or id_before(b, a) then return a end
  return b
end

-- the subject filter: per character, the forms it may take
local wanted = {}
for group in string.gmatch(f_subject, '[^\n]+') do
  local forms = {}
  for form in string.gmatch(group, '[^\t]+') do forms[#forms + 1] = form end
  wanted[#wanted + 1] = forms
end
local function matches_at(s, pos, k)
  if k > #wanted then return true end
  for _, form in ipairs(wanted[k]) do
    if string.sub(s, pos, pos + #form - 1) == form and matches_at(s, pos + #form, k + 1) then
      return true
    end
  end
  return false
end
local function subject_matches(s)
  for pos = 1, #s do
    if matches_at(s, pos, 1) then return true end
  end
  return #wanted == 0
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
    count_in(inbox, agent, -1)
    floor_pending(stream, inbox, agent)
    redis.call('HSET', marks, id .. '\n' .. agent, 'J' .. now .. ':replay')
  end
end

local dead = 0 -- entries this read dead-lettered
local most = nil
local function max_deliveries() -- (read once, when a read first needs it)
  if not most then most = tonumber(redis.call('HGET', meta, 'max_deliveries') or '') or 5 end
  return most
end

local more = 0 -- 1: the fetch stopped at its cap with entries left (call again)
if pull then
  local fetched = 0
  local fetched_mine, mine_n = {}, 0 -- the agent's entries fetched
  while true do
    local r = redis.call('XREADGROUP', 'GROUP', agent, consumer, 'COUNT', 1000, 'STREAMS', stream, '>')
    local entries = {}
    if r and r[1] then
      -- Redis replies {{stream, entries}}; fakeredis (the test double) {stream, entries}
      entries = r[2]
      if type(r[1]) == 'table' then entries = r[1][2] end
    end
    local others = {}
    local copies = {} -- rejected once the others' entries are acknowledged (see reject_copy)
    for _, e in ipairs(entries) do
      local mine = addressed(e[2], agent)
      if mine then -- fetched here: its bell entry is no longer for a wait to take
        fetched_mine[e[1]], mine_n = true, mine_n + 1
      end
      if not mine then others[#others + 1] = e[1]
      elseif finished(redis.call('HGET', marks, e[1] .. '\n' .. agent)) then
        others[#others + 1] = e[1] -- finished before: a rewound group gives it again
      elseif expired(e[1], e[2]) then expire(e[1])
      elseif copied(e[1], e[2], true) then copies[#copies + 1] = e[1] end
    end
    if #others > 0 then redis.call('XACK', stream, agent, unpack(others)) end
    for _, id in ipairs(copies) do reject_copy(id) end
    fetched = fetched + #entries
    if #entries < 1000 then break end
    if fetched >= CAP then more = 1 break end
  end
  if mine_n > 0 then -- their ids leave the bell (it is in stream order: they lead it)
    local span = 2 * mine_n + 8
    local rings = redis.call('LRANGE', bell, 0, span - 1)
    local k = 0
    while k < #rings and fetched_mine[rings[k + 1]] do k = k + 1 end
    if k > 0 then redis.call('LTRIM', bell, k, -1) end
    local left = #rings - k
    for i = k + 1, #rings do -- past a raw write into the bell: one by one
      if fetched_mine[rings[i]] then redis.call('LREM', bell, 1, rings[i]); left = left - 1 end
    end
    -- the bell emptied: its wakeup goes (known without a look when the range read it whole)
    if (#rings < span and left == 0) or (#rings == span and redis.call('EXISTS', bell) == 0) then
      redis.call('DEL', wakeup)
    end
  end
end
if limit == 0 then return {now, 0, more, ''} end

local out = {now, 0, more, ''}
local scanned, found = 0, 0

-- the filters that need no mark: 0 when entry fields `f` fail them, 1 when they pass and the
-- entry is not the agent's, 2 when it is
local function passes(f)
  local mine = addressed(f, agent)
  local from = field(f, 'f')
  if scope == 'own' and not mine and from ~= agent then return 0 end
  if f_from ~= '' and from ~= f_from then return 0 end
  if f_to ~= '' and not addressed(f, f_to) then return 0 end
  if f_subject ~= '' and not subject_matches(field(f, 's') or '') then return 0 end
  return mine and 2 or 1
end

-- The agent's marks, read ahead by the walks below (forward, newest first): from the entry
-- `cur_i` of the batch `cur_batch` they consider, the next entries that pass and are the
-- agent's, as many as the messages still wanted, in one HMGET instead of one HGET each. A
-- mark is written only by the consideration of its own entry, so what was read ahead holds.
local pass_of, mark_of = {}, {} -- entry id -> passes(); -> its mark ("" for none)
local cur_batch, cur_i = nil, 0
local function read_ahead()
  local ids, fields, n, want = {}, {}, 0, limit - found
  -- (each entry makes at most one message: the next `want` are all that can be needed now)
  for i = cur_i, math.min(#cur_batch, cur_i + want - 1) do
    local e = cur_batch[i]
    local id = e[1]
    local kind = pass_of[id]
    if not kind then kind = passes(e[2]); pass_of[id] = kind end
    if kind == 2 and not mark_of[id] then
      n = n + 1
      ids[n], fields[n] = id, id .. '\n' .. agent
    end
  end
  if n == 0 then return end
  local got = redis.call('HMGET', marks, unpack(fields, 1, n))
  for i = 1, n do mark_of[ids[i]] = got[i] or '' end
end

-- `mk0` and `p0`, when the caller knows them (the unread walk below): the entry's mark ("" for
-- none) and its pending entry, so neither is looked up again
local function consider(e, mk0, p0)
  local id, f = e[1], e[2]
  local kind = pass_of[id] or passes(f)
  if kind == 0 then return end
  local mine = kind == 2
  local mk = '-'
  if mine then
    if not mk0 and cur_batch and not mark_of[id] then read_ahead() end
    mk = mk0 or mark_of[id] or redis.call('HGET', marks, id .. '\n' .. agent) or ''
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
  local handed = 0
  if mine and mark_read then
    local p = p0 or redis.call('XPENDING', stream, agent, id, id, 1)[1]
    if p then -- not done: this read hands it out (with no mark, it never was before)
      local before = mk == '' and 0 or tonumber(p[4])
      if before > 0 and before >= max_deliveries() then -- (never handed out: not read)
        if dead_letter(dlq, id, agent, before, f, now)
          and redis.call('XACK', stream, agent, id) == 1 then
          count_in(inbox, agent, -1)
          redis.call('HSET', marks, id .. '\n' .. agent, 'F' .. now .. ':max_deliveries')
          trip(meta, rate, agent, now)
          dead = dead + 1
          return
        end
      end
      redis.call('XCLAIM', stream, agent, consumer, 0, id, 'RETRYCOUNT', before + 1, 'JUSTID')
      handed = before + 1
    end
    if mk == '' then soft('HSET', marks, id .. '\n' .. agent, 'R' .. now) end
  end
  out[#out + 1] = {id, f, mk, handed}
  found = found + 1
end

-- The walks read the stream in batches: the first as large as the messages wanted (at least
-- 16, at most 200), each next one twice the last, up to 200: every entry a batch holds is
-- made a Lua table, so a list of the newest 20 reads about 20, not 200, when most pass.
local function first_size()
  return math.min(200, math.max(16, limit - found))
end

-- walk entries forward from the exclusive bound `from_id` (or the start), at most to the cap;
-- returns the id to resume after, or nil when the walk reached the end or the limit
local function forward(from_id)
  local cursor = from_id == '' and '-' or '(' .. from_id
  local size = first_size()
  while found < limit do
    if scanned >= CAP then return string.sub(cursor, 2) end
    local batch = redis.call('XRANGE', stream, cursor, '+', 'COUNT', size)
    cur_batch = batch
    for i, e in ipairs(batch) do
      scanned, cur_i = scanned + 1, i
      consider(e)
      if found >= limit then return nil end
    end
    if #batch < size then return nil end
    cursor = '(' .. batch[#batch][1]
    size = math.min(200, 2 * size)
  end
  return nil
end

local kind, from_id = string.sub(resume, 1, 1), string.sub(resume, 2)
if unread_only then
  -- 1. the group's pending entries that are not marked read: looked up by id
  if kind == 'a' or kind == '' then kind, from_id = 'p', after end
  if kind == 'p' then
    local start = from_id == '' and '-' or from_id
    while found < limit do
      local pel = redis.call('XPENDING', stream, agent, start, '+', 200)
      local had = {} -- the page's marks, in one command
      if pel[1] then
        local fields = {}
        for i, p in ipairs(pel) do fields[i] = p[1] .. '\n' .. agent end
        had = redis.call('HMGET', marks, unpack(fields))
      end
      local last = nil
      for i, p in ipairs(pel) do
        local id = p[1]
        last = id
        if from_id == '' or id_before(from_id, id) then
          scanned = scanned + 1
          if not had[i] then
            local e = redis.call('XRANGE', stream, id, id)[1]
            if e then consider(e, '', p) end
            if found >= limit then break end
          end
        end
      end
      if found >= limit or #pel < 200 then break end
      if scanned >= CAP then out[2], out[4] = scanned, 'p' .. last return out end
      start, from_id = last, last
    end
    if found >= limit then out[2] = scanned return out end
    if pull and more == 1 then out[2], out[4] = scanned, 'a' return out end
    kind, from_id = 'n', after
  end
  -- 2. list (no fetch): entries after the group's cursor, never delivered to the agent
  if kind == 'n' and not pull then
    local last = nil
    for _, g in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
      local name, cur
      for i = 1, #g, 2 do
        if g[i] == 'name' then name = g[i + 1] elseif g[i] == 'last-delivered-id' then cur = g[i + 1] end
      end
      if name == agent then last = cur end
    end
    if last then
      local stop = forward(later(from_id, last))
      if stop then out[4] = 'n' .. stop end
    end
  end
elseif after ~= '' or kind == 'f' then
  local stop = forward(kind == 'f' and from_id or after)
  if stop then out[4] = 'f' .. stop end
else
  -- newest `limit` messages, returned oldest first
  local cursor, picked = '+', {}
  if kind == 'v' then cursor = '(' .. from_id end
  local size = first_size()
  while found < limit do
    if scanned >= CAP then out[4] = 'v' .. string.sub(cursor, 2) break end
    local batch = redis.call('XREVRANGE', stream, cursor, '-', 'COUNT', size)
    cur_batch = batch
    for i, e in ipairs(batch) do
      scanned, cur_i = scanned + 1, i
      local n = #out
      consider(e)
      if #out > n then picked[#picked + 1] = table.remove(out) end
      if found >= limit then break end
    end
    if #batch < size then break end
    cursor = '(' .. batch[#batch][1]
    size = math.min(200, 2 * size)
  end
  for i = #picked, 1, -1 do out[#out + 1] = picked[i] end
end
out[2] = scanned
return out
