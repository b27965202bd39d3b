-- done.lua: mark messages done for an agent: acknowledge, count down its inbox, stamp receipts.
-- All or nothing: when any id is refused, nothing changes.
--
-- KEYS[1] stream  KEYS[2] inbox  KEYS[3] marks
-- ARGV[1] agent (its group)   ARGV[2] result text ("" for none)   ARGV[3..] ids: entry ids
--
-- returns one flag per id:
--    1  done now                      0  already done (nothing to do)
--   -1  refused: unknown, or not addressed to the agent
--   -2  addressed to the agent but not fetched by it yet (the caller fetches, then retries)
-- any -1 or -2 means nothing was changed
--
-- A done mark keeps the read and delivery times: "D<done_ms>:<read_ms>:<delivered_ms>:<result>"
-- (for one id the agent read, the delivery time is the read time: see below).

local stream, inbox, marks, agent, result = KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2]
-- the clock as text: the mark is written from text (Lua turns a number into text with a
-- printf of a float, the costliest step of this script when it did); as a number only in the
-- second pass, where delivery times are worked out
local now_s = time_text(redis.call('TIME'))

local function addressed_here(id) -- is entry `id` addressed to the agent?
  local e = redis.call('XRANGE', stream, id, id)[1]
  return e ~= nil and addressed(e[2], agent)
end

-- One id read by the agent (a read mark), the common case: acknowledged first, the
-- acknowledgement the check that it was pending (nothing else changes when it was not, and
-- the passes below decide). Delivered when read: the mark is written when the entry is
-- handed over (or, deferred, when the handle next calls the server).
if #ARGV == 3 then
  local id = ARGV[3]
  local key = id .. '\n' .. agent
  local mark = redis.call('HGET', marks, key)
  -- (82 is 'R': string.byte makes no string; measured 4,500 instructions a call below string.sub)
  if mark and string.byte(mark, 1) == 82 and redis.call('XACK', stream, agent, id) == 1 then
    local read = string.sub(mark, 2)
    if read == '' then read = now_s end
    count_in(inbox, agent, -1)
    redis.call('HSET', marks, key, 'D' .. now_s .. ':' .. read .. ':' .. read .. ':' .. result)
    return {1}
  end
end

-- first pass: classify every id, change nothing
local flags, plan, refused = {}, {}, false
for i = 3, #ARGV do
  local id = ARGV[i]
  local mark = redis.call('HGET', marks, id .. '\n' .. agent) or ''
  local pel = redis.call('XPENDING', stream, agent, id, id, '1')[1]
  local kind = string.sub(mark, 1, 1)
  if kind == 'D' then
    flags[#flags + 1] = 0
  elseif pel and (kind == 'R' or addressed_here(id)) then
    flags[#flags + 1] = 1
    plan[#plan + 1] = {id, mark, pel}
  elseif not pel and kind == '' and addressed_here(id) then
    flags[#flags + 1] = -2
    refused = true
  else
    flags[#flags + 1] = -1
    refused = true
  end
end
if refused then
  for i, f in ipairs(flags) do if f == 1 then flags[i] = 0 end end
  -- report which ids blocked the call; the others stay as they are (0 = unchanged)
  for i = 3, #ARGV do
    if flags[i - 2] == 0 then
      local mark = redis.call('HGET', marks, ARGV[i] .. '\n' .. agent) or ''
      if string.sub(mark, 1, 1) ~= 'D' then flags[i - 2] = 2 end
    end
  end
  return flags
end

-- second pass: every id is fine, act
local now = tonumber(now_s)
for _, p in ipairs(plan) do
  local id, mark, pel = p[1], p[2], p[3]
  local idle = pel[3] -- ms since the delivery: the delivery is that long before now
  local delivered = idle == 0 and now_s or string.format('%d', now - tonumber(idle))
  local read = ''
  if string.sub(mark, 1, 1) == 'R' then read = string.sub(mark, 2) end
  if read == '' then read = now_s end
  redis.call('XACK', stream, agent, id)
  count_in(inbox, agent, -1)
  redis.call('HSET', marks, id .. '\n' .. agent,
    'D' .. now_s .. ':' .. read .. ':' .. delivered .. ':' .. result)
end
return flags
