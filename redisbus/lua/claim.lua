-- claim.lua: hand a replica the pending entries due to it, counting hand-outs exactly, and
-- dead-letter those already handed out max_deliveries times, in one atomic step. Due are:
-- this replica's own pending entries it does not hold (after a restart, a reply lost to a
-- dropped connection, or entries read() or mark_done() fetched ahead), and entries whose
-- lease ran out, on another replica or on this one.
--
-- KEYS[1] stream  KEYS[2] inbox  KEYS[3] marks  KEYS[4] dlq  KEYS[5] rate  KEYS[6] meta
-- KEYS[7] status (optional): an agent that ended (failed, cancelled, lost) is handed nothing
-- ARGV[1] agent (its group)  ARGV[2] consumer (this replica)  ARGV[3] lease (ms, min idle)
-- ARGV[4] max_deliveries
-- ARGV[5] count: at most this many entries whose lease ran out are examined (0: none)
-- ARGV[6] own: "" to leave this replica's own entries alone; else where to start in its own
--         pending list ("-" from the first, or the exclusive id the previous call resumed at)
-- ARGV[7..] held: ids this replica holds (returned to its caller, not done): not handed
--         out as its own, so their lease keeps running (they come back once it ran out, as
--         any entry)
--
-- returns {claimed, dead, resume, now_ms[, status]}: status (with KEYS[7]) the agent's; claimed = {{id, {field, value...}, deliveries}, ...} now
-- owned by this replica; dead = number of entries moved to the dead-letter stream; resume =
-- the id to pass as ARGV[6] next to go on through the own pending list, or "" at its end;
-- now_ms = the Redis clock
--
-- Deliveries count hand-outs to the agent's code, never reads: Redis's own delivery counter
-- counts every XREADGROUP of an entry, so nothing here reads the group. An entry is claimed
-- with XCLAIM ... RETRYCOUNT (its counter set, its idle time reset), and marked read in the
-- same step. An entry with no receipt mark was fetched (read() or mark_done() fetch ahead) but
-- never handed out: whatever its counter says, it was handed out 0 times. With a mark, the
-- counter is the number of hand-outs (a new-message fetch counts 1 and marks it read).
-- Such an entry whose ttl passed is expired rather than handed out (it was never delivered).
-- Entries not addressed to the agent (a replica died before acknowledging them) are
-- acknowledged on the spot.

local stream, inbox, marks, dlq, rate, meta = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local agent, consumer, lease = ARGV[1], ARGV[2], tonumber(ARGV[3])
local max_deliveries, count, own = tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6] or ''
local now = now_ms()
if KEYS[7] then -- an agent that ended takes nothing more: its replicas' wait() says so
  local st = redis.call('HGET', KEYS[7], agent)
  if st == 'failed' or st == 'cancelled' or st == 'lost' then return {{}, 0, '', now, st} end
end
local held = {}
for i = 7, #ARGV do held[ARGV[i]] = true end

local claimed, dead = {}, 0

-- hand pending entry `id` (Redis counter `n`) to this replica, or retire it
local function hand(id, n, min_idle)
  local e = redis.call('XRANGE', stream, id, id)[1]
  if not e then
    -- trimmed while pending: nothing left to deliver
    if redis.call('XACK', stream, agent, id) == 1 then count_in(inbox, agent, -1) end
    return
  end
  if not addressed(e[2], agent) then
    redis.call('XACK', stream, agent, id)
    return
  end
  local key = id .. '\n' .. agent
  local mark = redis.call('HGET', marks, key)
  local handed = mark and tonumber(n) or 0
  if handed >= max_deliveries then
    if not dead_letter(dlq, id, agent, handed, e[2], now) then return end -- (no room yet)
    redis.call('XACK', stream, agent, id)
    count_in(inbox, agent, -1)
    redis.call('HSET', marks, key, 'F' .. now .. ':max_deliveries')
    dead = dead + 1
    trip(meta, rate, agent, now)
    return
  end
  local ttl = not mark and ttl_of(field(e[2], 'x'))
  if ttl and tonumber(string.match(id, '^(%d+)')) + ttl * 1000 < now then
    if redis.call('XACK', stream, agent, id) == 1 then
      count_in(inbox, agent, -1)
      redis.call('HSET', marks, key, 'X' .. now)
    end
    return
  end
  local got = redis.call('XCLAIM', stream, agent, consumer, min_idle, id,
    'RETRYCOUNT', handed + 1, 'JUSTID')
  if got[1] then
    if not mark then soft('HSET', marks, key, 'R' .. now) end
    claimed[#claimed + 1] = {id, e[2], handed + 1}
  end
end

-- 1. this replica's own entries it does not hold, whatever their idle time
local resume = ''
if own ~= '' then
  local start = own == '-' and '-' or '(' .. own
  local pel = redis.call('XPENDING', stream, agent, start, '+', 500, consumer)
  for _, p in ipairs(pel) do
    if not held[p[1]] then hand(p[1], p[4], 0) end
  end
  if #pel == 500 then resume = pel[#pel][1] end
end
-- 2. whoever holds it (this replica too): the lease ran out. A live replica still handling
--    an entry extends its lease, so one that ran out was failed or forgotten (with a single
--    replica, nobody else would ever redeliver it).
if count > 0 then
  for _, p in ipairs(redis.call('XPENDING', stream, agent, 'IDLE', lease, '-', '+', count)) do
    hand(p[1], p[4], lease)
  end
end
return {claimed, dead, resume, now}
