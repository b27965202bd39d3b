-- done.lua: mark messages done for an agent: acknowledge, count down its inbox, stamp receipts.
--
-- KEYS[1] stream  KEYS[2] inbox  KEYS[3] marks
-- ARGV[1] agent (its group)   ARGV[2] result text ("" for none)   ARGV[3..] entry ids
--
-- returns one flag per id: 1 done now, 0 already done, -1 not addressed to the agent or not
-- fetched by it yet (read it first)
--
-- A done mark keeps the read and delivery times: "D<done_ms>:<read_ms>:<delivered_ms>:<result>".

local stream, inbox, marks, agent, result = KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
for i = 3, #ARGV do
  local id = ARGV[i]
  local field = id .. '\n' .. agent
  local pel = redis.call('XPENDING', stream, agent, id, id, 1)
  local addressed = false
  local mark = redis.call('HGET', marks, field) or ''
  if pel[1] and string.sub(mark, 1, 1) == 'R' then
    addressed = true -- it was returned to the agent as its own message
  elseif pel[1] then
    local e = redis.call('XRANGE', stream, id, id)
    if e[1] then
      local f = e[1][2]
      for j = 1, #f, 2 do
        if f[j] == 't' then
          addressed = string.find('\n' .. f[j + 1] .. '\n', '\n' .. agent .. '\n', 1, true) ~= nil
        end
      end
    end
  end
  if addressed then
    local delivered = now - tonumber(pel[1][3])
    local read = ''
    if string.sub(mark, 1, 1) == 'R' then read = string.sub(mark, 2) end
    if read == '' then read = tostring(now) end
    redis.call('XACK', stream, agent, id)
    redis.call('HINCRBY', inbox, agent, -1)
    redis.call('HSET', marks, field, 'D' .. now .. ':' .. read .. ':' .. delivered .. ':' .. result)
    out[#out + 1] = 1
  else
    if string.sub(mark, 1, 1) == 'D' then out[#out + 1] = 0 else out[#out + 1] = -1 end
  end
end
return out
