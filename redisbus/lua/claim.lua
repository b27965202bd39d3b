-- claim.lua: take over an agent's messages whose lease ran out (on another replica or on this
-- one), and dead-letter those already delivered max_deliveries times, in one atomic step.
--
-- KEYS[1] stream  KEYS[2] inbox  KEYS[3] marks  KEYS[4] dlq  KEYS[5] rate  KEYS[6] meta
-- ARGV[1] agent (its group)  ARGV[2] consumer (this replica)  ARGV[3] lease (ms, min idle)
-- ARGV[4] max deliveries     ARGV[5] count (at most this many pending entries examined)
--
-- returns {claimed, dead}: claimed = {{id, {field, value...}, deliveries}, ...} now owned by
-- this replica; dead = number of entries moved to the dead-letter stream
--
-- This replica's own entries are claimed too once idle past the lease: a live replica still
-- handling one extends its lease, so one that ran out was failed or forgotten (with a single
-- replica, nobody else would ever redeliver it). Entries not addressed to the agent (a replica
-- died before acknowledging them) are acknowledged on the spot.

local stream, inbox, marks, dlq, rate, meta = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local agent, consumer, lease = ARGV[1], ARGV[2], tonumber(ARGV[3])
local max_deliveries, count = tonumber(ARGV[4]), tonumber(ARGV[5])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- circuit breaker: count a dead letter of `who`; enough within the window open its breaker
-- (kept identical to sweep.lua's: scripts cannot share code; send.lua reads the result)
local function trip(who)
  local cfg = redis.call('HMGET', meta, 'breaker_failures', 'breaker_window_s', 'breaker_cooldown_s')
  local limit = tonumber(cfg[1] or '0')
  if limit <= 0 then return end
  local window, cool = tonumber(cfg[2] or '0') * 1000, tonumber(cfg[3] or '0') * 1000
  local v = redis.call('HGET', rate, 'b\n' .. who)
  local n, first = 0, now
  if v then
    local a, b = string.match(v, '^(%d+) (%d+)')
    n, first = tonumber(a), tonumber(b)
    if now - first > window then n, first = 0, now end
  end
  n = n + 1
  local until_ms = 0
  if n >= limit then n, first, until_ms = 0, now, now + cool end
  redis.call('HSET', rate, 'b\n' .. who, n .. ' ' .. first .. ' ' .. until_ms)
end

local function addressed(f)
  for i = 1, #f, 2 do
    if f[i] == 't' then
      return string.find('\n' .. f[i + 1] .. '\n', '\n' .. agent .. '\n', 1, true) ~= nil
    end
  end
  return false
end

local claimed, dead = {}, 0
local pel = redis.call('XPENDING', stream, agent, 'IDLE', lease, '-', '+', count)
for _, p in ipairs(pel) do
  local id, owner, deliveries = p[1], p[2], tonumber(p[4])
  do -- whoever holds it (`owner`), even this replica: the lease ran out
    local e = redis.call('XRANGE', stream, id, id)[1]
    if not e then
      -- trimmed while pending: nothing left to deliver
      if redis.call('XACK', stream, agent, id) == 1 then redis.call('HINCRBY', inbox, agent, -1) end
    elseif not addressed(e[2]) then
      redis.call('XACK', stream, agent, id)
    elseif deliveries >= max_deliveries then
      local fields = {'o', id, 'a', agent, 'n', tostring(deliveries), 'w', 'max_deliveries',
        'dead_ms', tostring(now)}
      for _, v in ipairs(e[2]) do fields[#fields + 1] = v end
      redis.call('XADD', dlq, '*', unpack(fields))
      redis.call('XACK', stream, agent, id)
      redis.call('HINCRBY', inbox, agent, -1)
      redis.call('HSET', marks, id .. '\n' .. agent, 'F' .. now .. ':max_deliveries')
      dead = dead + 1
      trip(agent)
    else
      local got = redis.call('XCLAIM', stream, agent, consumer, lease, id)
      if got[1] and got[1][2] then claimed[#claimed + 1] = {got[1][1], got[1][2], deliveries + 1} end
    end
  end
end
return {claimed, dead}
