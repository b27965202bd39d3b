-- wake.lua: hand a replica the entries its agent's doorbell names: the fetch of the wait path.
--
-- KEYS[1] stream  KEYS[2] inbox  KEYS[3] marks  KEYS[4] status  KEYS[5] bell (the agent's)
-- KEYS[6] wakeup (the agent's: what its waits block on)
-- KEYS[7] nonces (hash "kid:nonce" -> the first entry id that carried it)
-- KEYS[8] nonce_at (sorted set "kid:nonce" by the ms it was recorded: what to forget)
--         (KEYS[7] and KEYS[8] are read only with KEEP_MS > 0: a caller with signing off may
--         leave them out)
-- ARGV[1] agent (its group)   ARGV[2] consumer (the replica)   ARGV[3] keep: KEEP_MS, or 0
-- ARGV[4] blocked: "1" when the call follows the wait's blocking pop of the wakeup list (it
--         took the wakeup, or there was none), "0" when it does not (the wakeup is stale
--         once the bell is empty: it goes)
--
-- returns {seconds, microseconds, {replayed entry ids} or false, status or false, entries}
--   the Redis clock; the entries rejected as copies of earlier signed entries; the agent's
--   status when the call handed it work (then "running") or found the bell empty (so a
--   replica of an agent that ended learns it at the end of its next quiet wait); entries is
--   {{id, {field, value, ...}}, ...}, what the replica was handed, in the bell's order
--
-- Why a bell. Every agent of a channel has its own consumer group on the channel's stream
-- (its read/unread record), so a wait that blocked on the stream (XREADGROUP BLOCK) returned
-- for every entry anyone sent, and each agent read and acknowledged entries that were not for
-- it: a channel of n waiting agents paid n wake-ups for one direct message. Instead, whatever
-- writes an entry to agents (send.lua, outcome.lua, replay.lua) rings each recipient's bell,
-- in the same script: the entry id appended to the recipient's bell (a list), and one item in
-- its wakeup list when the bell was empty (see ring in _prelude.lua). A wait first calls this
-- alone (blocked "0": what was rung while the agent was busy, in one script; after such a look
-- found nothing, the handle's next three waits skip it); finding nothing, it blocks on its
-- own wakeup list (BLPOP: it frees, so it works at maxmemory too; one replica is woken per
-- wakeup) and then calls this, in the same pipeline, which pops up to 500 of the bell's ids
-- (one LPOP; a wakeup is put back for the rest), claims the entries they name into the
-- replica's pending list (XCLAIM ... FORCE: a group read is never made, so no other agent's
-- entry is handed over), and marks them read. The claim moves the group's cursor past them:
-- every entry up to there addressed to the agent was rung and is taken now, so read()'s fetch
-- (view.lua) starts there instead of walking the others' entries before it.
--
-- What a bell names is checked as a fetch's entries were: an entry the agent has a mark for
-- (read and pending, or finished) was handed out before and is passed over; one not
-- addressed to the agent (a raw write into a bell) is acknowledged and passed over; with
-- KEEP_MS > 0 (signing on), a signed entry whose (key, nonce) an earlier entry carried is a
-- replay, rejected ("J<ms>:replay"), and the first entry id of each pair is remembered KEEP_MS;
-- one whose ttl passed is expired ("X<ms>"). What is no entry id is dropped. At maxmemory
-- (noeviction) read marks and the status are skipped (see soft): taking from a bell frees.

local stream, inbox, marks, status, bell = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local wakeup, nonces, nonce_at = KEYS[6], KEYS[7], KEYS[8]
local agent, consumer, keep = ARGV[1], ARGV[2], tonumber(ARGV[3] or '') or 0
local blocked = ARGV[4] == '1'
local t = redis.call('TIME')
local rings = redis.call('LPOP', bell, '500') or {}
local nr = #rings
if nr == 500 then -- more are rung: the next wait is woken for them at once
  if redis.call('LLEN', wakeup) == 0 and redis.call('LLEN', bell) > 0 then
    soft('RPUSH', wakeup, '')
  end
elseif not blocked then -- no wait took the wakeup the bell's ids rang: it is stale now
  redis.call('DEL', wakeup)
end
if nr == 0 then return {t[1], t[2], false, redis.call('HGET', status, agent) or false, {}} end
local now_s = time_text(t) -- marks carry it as text
-- (as a number for the replay record, and for a ttl below: Lua's tonumber is a strtod)
local now = keep > 0 and tonumber(now_s) or nil

-- the entry ids the bell names, each once (a stream id within Redis's range)
local want, seen = {}, {}
for i = 1, nr do
  local id = rings[i]
  local ms, seq = string.match(id or '', '^(%d+)%-(%d+)$')
  if ms and #ms <= 15 and #seq <= 19 and not seen[id] then
    seen[id] = true
    want[#want + 1] = id
  end
end

-- those never handed out before: no mark. One id (the common case): its read mark written
-- now, if it has none (HSETNX: the look and the write in one command; taken back below when
-- the entry turns out to be gone or not the agent's). Several: one HMGET for them all.
local fresh, premarked = {}, nil
if #want == 1 then
  local key = want[1] .. '\n' .. agent
  local r = soft('HSETNX', marks, key, 'R' .. now_s)
  if r == 1 then
    fresh[1], premarked = want[1], key
  elseif r == false then -- refused (at maxmemory): looked at only, the read mark is skipped
    if not redis.call('HGET', marks, key) then fresh[1] = want[1] end
  end
elseif want[1] then
  local fields = {}
  for i = 1, #want do fields[i] = want[i] .. '\n' .. agent end
  local had = redis.call('HMGET', marks, unpack(fields))
  for i = 1, #want do
    if not had[i] then fresh[#fresh + 1] = want[i] end
  end
end

local out = {t[1], t[2], false, false, {}}
local handed = out[5]
local replayed, clamp, got, recorded = nil, false, false, 0
if fresh[1] then
  -- claimed with the group's cursor moved past them (LASTID: it only ever moves forward), so
  -- nothing is both pending and past the cursor (repair.lua counts those as not fetched yet)
  local last = fresh[1]
  for i = 2, #fresh do
    if id_before(last, fresh[i]) then last = fresh[i] end
  end
  local args = {'XCLAIM', stream, agent, consumer, '0'}
  for i = 1, #fresh do args[#args + 1] = fresh[i] end
  local n = #args
  args[n + 1], args[n + 2], args[n + 3] = 'RETRYCOUNT', '1', 'FORCE'
  local claimed -- (entries trimmed away since are left out)
  if redis.REDIS_VERSION then -- Redis 7+, Valkey: in the claim
    args[n + 4], args[n + 5] = 'LASTID', last
    claimed = redis.call(unpack(args))
  else -- Redis 6.2, the in-memory double (which takes LASTID for an entry id): in two steps
    claimed = redis.call(unpack(args))
    redis.pcall('XGROUP', 'SETID', stream, agent, last)
  end
  local me = '\n' .. agent .. '\n'
  local others, no, reads, kept = {}, 0, {}, false
  for i = 1, #claimed do
    local e = claimed[i]
    local eid, f = e[1], e[2]
    local to, ttl, sig = '', nil, nil
    for j = 1, #(f or {}), 2 do
      local k = f[j]
      if k == 't' then to = f[j + 1]
      elseif k == 'x' then ttl = ttl_of(f[j + 1])
      elseif k == 'g' then sig = f[j + 1] end
    end
    if not f or not string.find('\n' .. to .. '\n', me, 1, true) then
      no = no + 1
      others[no] = eid
    else
      if keep > 0 and sig then recorded = recorded + 1 end
      if keep > 0 and sig and seen_before(nonces, nonce_at, eid, sig, now, true) then
        local n = reject(stream, inbox, marks, agent, eid, 'replay', now_s)
        clamp, kept = clamp or n == 1, n == 1
        if not replayed then replayed = {} end
        replayed[#replayed + 1] = eid
      elseif not ttl or tonumber(string.match(eid, '^(%d+)')) + ttl * 1000
        >= (now or tonumber(now_s)) then
        if not premarked then
          reads[#reads + 1], reads[#reads + 2] = eid .. '\n' .. agent, 'R' .. now_s
        end
        handed[#handed + 1] = e
        got, kept = true, true
      elseif redis.call('XACK', stream, agent, eid) == 1 then -- expired
        count_in(inbox, agent, -1)
        redis.call('HSET', marks, eid .. '\n' .. agent, 'X' .. now_s)
        kept = true
      end
    end
  end
  if no > 0 then redis.call('XACK', stream, agent, unpack(others, 1, no)) end
  if reads[1] then soft('HSET', marks, unpack(reads)) end
  -- the one id's read mark, written before the claim, for an entry that was not handed over
  -- nor marked otherwise: gone (trimmed), not the agent's, or a replay not pending
  if premarked and not kept then redis.call('HDEL', marks, premarked) end
end
if keep > 0 then -- forget pairs older than KEEP_MS: as many as this call recorded, and
  -- 100 more, so the record keeps pace with the traffic (the janitor forgets the rest)
  local old = redis.call('ZRANGEBYSCORE', nonce_at, '-inf', now - keep, 'LIMIT', 0, 100 + recorded)
  if old[1] then
    redis.call('HDEL', nonces, unpack(old))
    redis.call('ZREM', nonce_at, unpack(old))
  end
end
if clamp then floor_pending(stream, inbox, agent) end
out[3] = replayed or false
if got then -- the agent has work: it runs
  local s = redis.call('HGET', status, agent)
  if s == 'waiting' or s == 'idle' then
    if soft('HSET', status, agent, 'running') then s = 'running' end
  end
  out[4] = s or false
end
return out
