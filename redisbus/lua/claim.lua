-- claim.lua: take over an agent's messages whose lease ran out on another replica, and
-- dead-letter those already delivered max_deliveries times, in one atomic step.
--
-- KEYS[1] stream  KEYS[2] inbox  KEYS[3] marks  KEYS[4] dlq  KEYS[5] rate  KEYS[6] meta
-- ARGV[1] agent (its group)  ARGV[2] consumer (this replica)  ARGV[3] lease (ms, min idle)
-- ARGV[4] max deliveries     ARGV[5] count (at most this many pending entries examined)
--
-- returns {claimed, dead}: claimed = {{id, {field, value...}, deliveries}, ...} now owned by
-- this replica; dead = number of entries moved to the dead-letter stream
--
-- This replica's own pending entries are left alone: a restarted replica re-reads them itself,
-- and a live one is still handling them (it extends its lease). Entries not addressed to the
-- agent (a replica died before acknowledging them) are acknowledged on the spot.

local stream, inbox, marks, dlq, rate, meta = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local agent, consumer, lease = ARGV[1], ARGV[2], tonumber(ARGV[3])
local max_deliveries, count = tonumber(ARGV[4]), tonumber(ARGV[5])
local now = now_ms()

local claimed, dead = {}, 0
local pel = redis.call('XPENDING', stream, agent, 'IDLE', lease, '-', '+', count)
for _, p in ipairs(pel) do
  local id, owner, deliveries = p[1], p[2], tonumber(p[4])
  if owner ~= consumer then
    local e = redis.call('XRANGE', stream, id, id)[1]
    if not e then
      -- trimmed while pending: nothing left to deliver
      if redis.call('XACK', stream, agent, id) == 1 then redis.call('HINCRBY', inbox, agent, -1) end
    elseif not addressed(e[2], agent) then
      redis.call('XACK', stream, agent, id)
    elseif deliveries >= max_deliveries then
      dead_letter(dlq, id, agent, deliveries, e[2], now)
      redis.call('XACK', stream, agent, id)
      redis.call('HINCRBY', inbox, agent, -1)
      redis.call('HSET', marks, id .. '\n' .. agent, 'F' .. now)
      dead = dead + 1
      trip(meta, rate, agent, now)
    else
      local got = redis.call('XCLAIM', stream, agent, consumer, lease, id)
      if got[1] and got[1][2] then claimed[#claimed + 1] = {got[1][1], got[1][2], deliveries + 1} end
    end
  end
end
return {claimed, dead}
