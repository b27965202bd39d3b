#!lua name=design_floor
-- The smallest design of a message's life that keeps what the bus promises (docs/concepts.md), for
-- `python -m bench.instructions --design`: not redisbus, a yardstick. It is what a full
-- re-layout could reach at best, counted beside redisbus and raw Streams in one run.
--
-- Kept: the sender's and the pair's token buckets, the team budget and the inbox cap, read on
-- the Redis clock; the sender's and the recipient's status; the inbox depth counted up and
-- down; the recipient's doorbell and wakeup list (a direct message wakes its recipient only);
-- a read mark and a done mark with their times (the receipts). All of the channel's counters
-- and statuses are fields of one hash (redisbus keeps four hashes), so a send reads them in
-- one command and writes them in one.
-- Left out, each costing redisbus commands or Lua a life: idempotency keys, the pause switch,
-- loop protection's fields, ttl and signing checks, the status flip of a wake-up, the
-- general paths (several ids, broadcasts, refusals' details), maxmemory handling, and any
-- check of what a hostile client wrote. A design that keeps them costs more, not less.

-- tokens left in a bucket stored as "tokens:ms", refilled to `burst` at `per_s`
local function bucket(v, now, burst, per_s)
  if not v then return burst end
  local tokens, at = string.match(v, '^([%d.]+):(%d+)$')
  return math.min(burst, tonumber(tokens) + (now - tonumber(at)) * per_s / 1000)
end

local function clock(t) -- the Redis clock in ms, as text
  return t[1] .. string.sub(t[2] + 1000000, 2, 4)
end

-- KEYS stream, state (hash), bell (recipient's list), wakeup (recipient's list)
-- ARGV from, to, body, subject
-- returns the entry id, or an error naming the limit
redis.register_function('floor_send', function(KEYS, ARGV)
  local stream, state, bell, wakeup = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
  local from, to, body, subject = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
  local now_s = clock(redis.call('TIME'))
  local now = tonumber(now_s)
  local v = redis.call('HMGET', state, 's\n' .. from, 'p\n' .. from .. '\n' .. to,
    'd\n' .. to, 'a\n' .. to, 'a\n' .. from, '#sent')
  if v[4] ~= 'running' or v[5] ~= 'running' then return redis.error_reply('ENDED') end
  local depth, sent = tonumber(v[3] or '0'), tonumber(v[6] or '0')
  if depth >= 1000000 then return redis.error_reply('FULL') end
  if sent >= 1000000000 then return redis.error_reply('BUDGET') end
  local s = bucket(v[1], now, 1000000, 1000000)
  local p = bucket(v[2], now, 1000000, 1000000)
  if s < 1 or p < 1 then return redis.error_reply('RATE') end
  local id = redis.call('XADD', stream, '*', 'f', from, 't', to, 'b', body, 's', subject)
  if redis.call('RPUSH', bell, id) == 1 then redis.call('RPUSH', wakeup, '') end
  redis.call('HSET', state, 's\n' .. from, (s - 1) .. ':' .. now_s,
    'p\n' .. from .. '\n' .. to, (p - 1) .. ':' .. now_s, 'd\n' .. to, depth + 1,
    '#sent', sent + 1)
  return id
end)

-- KEYS stream, bell, marks, wakeup   ARGV agent (its group), consumer
-- returns {seconds, microseconds, entries}: the entry the bell named, if addressed to agent
redis.register_function('floor_wake', function(KEYS, ARGV)
  local stream, bell, marks, wakeup = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
  local agent, consumer = ARGV[1], ARGV[2]
  local t = redis.call('TIME')
  local ids = redis.call('LPOP', bell, '500')
  redis.call('DEL', wakeup)
  if not ids then return {t[1], t[2], {}} end
  local id = ids[1]
  redis.call('HSETNX', marks, id .. '\n' .. agent, 'R' .. clock(t))
  local got = redis.call('XCLAIM', stream, agent, consumer, '0', id,
    'RETRYCOUNT', '1', 'FORCE', 'LASTID', id)
  local out = {}
  for i = 1, #got do
    local f = got[i][2]
    for j = 1, #f, 2 do
      if f[j] == 't' and f[j + 1] == agent then out[#out + 1] = got[i] end
    end
  end
  return {t[1], t[2], out}
end)

-- KEYS stream, state, marks   ARGV agent, result, id
-- returns 1 when the message read was marked done now, else 0
redis.register_function('floor_done', function(KEYS, ARGV)
  local stream, state, marks = KEYS[1], KEYS[2], KEYS[3]
  local agent, result, id = ARGV[1], ARGV[2], ARGV[3]
  local now_s = clock(redis.call('TIME'))
  local key = id .. '\n' .. agent
  local mark = redis.call('HGET', marks, key)
  if mark and string.byte(mark, 1) == 82 and redis.call('XACK', stream, agent, id) == 1 then
    redis.call('HINCRBY', state, 'd\n' .. agent, '-1')
    local read = string.sub(mark, 2)
    redis.call('HSET', marks, key, 'D' .. now_s .. ':' .. read .. ':' .. read .. ':' .. result)
    return 1
  end
  return 0
end)
