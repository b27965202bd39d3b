-- settle.lua: record what a replica did with entries it fetched by a blocking XREADGROUP.
--
-- KEYS[1] stream  KEYS[2] inbox  KEYS[3] marks  KEYS[4] status
-- KEYS[5] nonces (hash "kid:nonce" -> the first entry id that carried it)
-- KEYS[6] nonce times (sorted set "kid:nonce" by the ms it was recorded: what to forget)
--         (KEYS[5] and KEYS[6] are read only by an "n" op with KEEP_MS > 0: a caller with
--         signing off may leave them out)
-- ARGV[1] agent (its group)
-- ARGV[2..] pairs: op, entry id, where op is
--   "a"  acknowledge an entry not addressed to the agent (it only advanced the group cursor)
--   "r"  mark an entry addressed to the agent as read (it was returned to the agent in full)
--   "x"  expire an entry addressed to the agent whose ttl passed before delivery
--   "d"  mark an entry addressed to the agent done (control messages, consumed on sight)
--   "j:REASON"  reject an entry addressed to the agent that failed a check (signature, key,
--        time, addressing): acknowledge it, count the inbox down and mark it "J<ms>:REASON"
--        (its receipt says rejected)
--   "s"  set the agent's status to the value in place of the id ("running", "waiting",
--        "idle"), only while it is one of those: a closed or completed agent keeps its status
--   "n"  in place of the id "AFTER\nCONSUMER\nKEEP_MS": the entries a fetch just gave
--        CONSUMER (its pending entries after AFTER): an entry the agent already finished
--        (done, dead-lettered, expired, rejected: a rewound group gives it again) is
--        acknowledged and left out, as a replay; mark those addressed to the agent read,
--        or expired (as "x") when their ttl passed; acknowledge the others (as "a"); when any
--        was read, set the agent "running" (as "s"). With KEEP_MS > 0 (signing on), a signed
--        entry whose (key, nonce) an earlier entry carried is a replay: rejected (as
--        "j:replay"); the first entry id of each pair is remembered KEEP_MS
--
-- returns the number of ops that changed something; a call that starts with an "n" op returns
-- {that number, seconds, microseconds, {replayed entry ids} or nil, status or nil}: the Redis
-- clock it read, which the fetch needs (the wait path then sends no TIME of its own), what it
-- rejected (nil when nothing), and the agent's status when the fetch gave it work or nothing
-- at all (a replica of an agent that ended, cancelled while another replica was the one
-- woken, learns it at the end of its next quiet slice)
--
-- At maxmemory (noeviction) read marks and statuses are skipped (see soft in _prelude.lua):
-- acknowledging, expiring and rejecting still work, so consumers drain a full server.
--
-- The wait path sends this around its XREADGROUP in one pipeline: the deferred ops before it,
-- an "n" op right after it, so the messages a wake-up returns are read at once (receipts and
-- unread counts say so) and the wake-up never pays a round trip for bookkeeping.

local stream, inbox, marks, status, agent = KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[1]
local nonces, nonce_at = KEYS[5], KEYS[6]
local t = redis.call('TIME')
local now_s = time_text(t) -- marks carry it as text
local now = tonumber(now_s)
local changed = 0
local replayed = nil -- the entries an "n" op rejected as replays (made on the first)
-- set when an entry was rejected: an entry a raw XADD wrote (an attack) was never counted in,
-- so the count is kept, at the end, at least what the group still holds pending (repair.lua
-- gives the exact count)
local clamp = false
local seen_status = nil -- the agent's status, as an "n" op found it (when it read it)

-- reject entry `id` that failed a check, for `reason`: acknowledged, the inbox counted down,
-- marked "J<ms>:REASON" (its receipt says rejected). Returns 1 when it was pending. (Its
-- arguments are passed, not seen from the script: a function that sees the script's locals
-- costs more to make, and every call of the script makes it.)
local function reject(stream, inbox, marks, agent, id, reason, now_s)
  if redis.call('XACK', stream, agent, id) == 1 then
    redis.call('HINCRBY', inbox, agent, -1)
    redis.call('HSET', marks, id .. '\n' .. agent, 'J' .. now_s .. ':' .. reason)
    return 1
  end
  return 0
end

for i = 2, #ARGV, 2 do
  local op, id = ARGV[i], ARGV[i + 1]
  if op == 'a' then
    changed = changed + redis.call('XACK', stream, agent, id)
  elseif op == 'r' then
    changed = changed + (soft('HSETNX', marks, id .. '\n' .. agent, 'R' .. now_s) or 0)
  elseif op == 'x' or op == 'd' then
    if redis.call('XACK', stream, agent, id) == 1 then
      redis.call('HINCRBY', inbox, agent, -1)
      local mark = 'X' .. now_s
      if op == 'd' then mark = 'D' .. now_s .. ':' .. now_s .. ':' .. now_s .. ':' end
      redis.call('HSET', marks, id .. '\n' .. agent, mark)
      changed = changed + 1
    end
  elseif op == 'n' then
    local sep = string.find(id, '\n', 1, true)
    local after, consumer, keep = string.sub(id, 1, sep - 1), string.sub(id, sep + 1), 0
    local sep2 = string.find(consumer, '\n', 1, true)
    if sep2 then -- (a KEEP_MS of 0 may be left out)
      consumer, keep = string.sub(consumer, 1, sep2 - 1), tonumber(string.sub(consumer, sep2 + 1)) or 0
    end
    local me, got = '\n' .. agent .. '\n', false
    local recorded = 0 -- signed entries of the agent this call looked up (and recorded)
    local pending = redis.call('XPENDING', stream, agent, '(' .. after, '+', 500, consumer)
    local np = #pending
    if np > 0 then
      -- the entries, in one range read: a fetch's entries are consecutive in the stream
      -- unless another replica's fetch took some in between (those are read and passed
      -- over; past twice as many, each entry left is read on its own)
      local fields_of, cut = {}, false
      if np == 1 then -- (the commonest fetch: one entry)
        local e = redis.call('XRANGE', stream, pending[1][1], pending[1][1])[1]
        if e then fields_of[e[1]] = e[2] end
      else
        local want, most = {}, 2 * np + 8
        for i = 1, np do want[pending[i][1]] = true end
        local rows = redis.call('XRANGE', stream, pending[1][1], pending[np][1], 'COUNT', most)
        for i = 1, #rows do
          local e = rows[i]
          if want[e[1]] then fields_of[e[1]] = e[2] end
        end
        cut = #rows == most
      end
      -- the others' entries, acknowledged together at the end (as "a")
      local others, no = nil, 0
      for i = 1, np do
        local eid = pending[i][1]
        local f = fields_of[eid]
        if not f and cut then
          local e = redis.call('XRANGE', stream, eid, eid)
          f = e[1] and e[1][2]
        end
        if f then -- (an entry trimmed away since is passed over)
          local to, ttl, sig = '', nil, nil
          for j = 1, #f, 2 do
            local k = f[j]
            if k == 't' then to = f[j + 1]
            elseif k == 'x' then ttl = ttl_of(f[j + 1])
            elseif k == 'g' then sig = f[j + 1] end
          end
          local mine = string.find('\n' .. to .. '\n', me, 1, true)
          if mine and keep > 0 and sig then recorded = recorded + 1 end
          if not mine then
            no = no + 1
            if no == 1 then others = {eid} else others[no] = eid end
          elseif keep > 0 and sig and seen_before(nonces, nonce_at, eid, sig, now, true) then
            local n = reject(stream, inbox, marks, agent, eid, 'replay', now_s)
            changed, clamp = changed + n, clamp or n == 1
            if not replayed then replayed = {} end
            replayed[#replayed + 1] = eid
          elseif not ttl or tonumber(string.match(eid, '^(%d+)')) + ttl * 1000 >= now then
            local key = eid .. '\n' .. agent
            if soft('HSETNX', marks, key, 'R' .. now_s) == 1 then
              changed, got = changed + 1, true
            elseif finished(redis.call('HGET', marks, key)) then
              -- done, dead-lettered, expired or rejected before: a rewound group (XGROUP
              -- SETID) hands it out again, but it is never new (as a replay)
              redis.call('XACK', stream, agent, eid)
              if not replayed then replayed = {} end
              replayed[#replayed + 1] = eid
            else
              got = true -- read before and not done (or no room for the mark): handed again
            end
          elseif redis.call('XACK', stream, agent, eid) == 1 then -- expired: as op "x"
            redis.call('HINCRBY', inbox, agent, -1)
            redis.call('HSET', marks, eid .. '\n' .. agent, 'X' .. now_s)
            changed = changed + 1
          end
        end
      end
      if no > 0 then changed = changed + redis.call('XACK', stream, agent, unpack(others, 1, no)) end
    end
    if keep > 0 then -- forget pairs older than KEEP_MS: as many as this call recorded, and
      -- 100 more, so the record keeps pace with the traffic (the janitor forgets the rest)
      local old = redis.call('ZRANGEBYSCORE', nonce_at, '-inf', now - keep, 'LIMIT', 0, 100 + recorded)
      if old[1] then
        redis.call('HDEL', nonces, unpack(old))
        redis.call('ZREM', nonce_at, unpack(old))
      end
    end
    if got then -- the agent has work: it runs (as op "s" with "running")
      seen_status = redis.call('HGET', status, agent)
      if seen_status == 'waiting' or seen_status == 'idle' then
        if soft('HSET', status, agent, 'running') then seen_status = 'running' end
      end
    elseif np == 0 then -- a quiet slice: the waiting replica learns whether its agent ended
      seen_status = redis.call('HGET', status, agent)
    end
  elseif string.sub(op, 1, 2) == 'j:' then
    local n = reject(stream, inbox, marks, agent, id, string.sub(op, 3), now_s)
    changed, clamp = changed + n, clamp or n == 1
  elseif op == 's' then
    local s = redis.call('HGET', status, agent)
    if (s == 'running' or s == 'waiting' or s == 'idle') and s ~= id then
      if soft('HSET', status, agent, id) then changed = changed + 1 end
    end
  end
end
if clamp then floor_pending(stream, inbox, agent) end
if ARGV[2] == 'n' then
  return {changed, t[1], t[2], replayed or false, seen_status or false}
end
return changed
