-- channel.lua: create a channel with its limits, or attach to it as stored.
--
-- KEYS[1] meta
-- ARGV[1] mode: "create" (create it when missing) or "attach" (it must exist)
-- ARGV[2..] triples: field, value, explicit ("1" when the caller passed the value itself)
--
-- returns {1, created (0|1), field, value, ...}   the stored configuration
--      or {0, field, stored, wanted}              an explicit value differs from the stored one
--      or {-1}                                    "attach" and there is no such channel

local meta = KEYS[1]
if redis.call('EXISTS', meta) == 1 then
  for i = 2, #ARGV, 3 do
    if ARGV[i + 2] == '1' then
      local stored = redis.call('HGET', meta, ARGV[i])
      local wanted = ARGV[i + 1]
      local a, b = tonumber(stored), tonumber(wanted)
      if stored ~= wanted and (a == nil or b == nil or a ~= b) then
        return {0, ARGV[i], tostring(stored), wanted}
      end
    end
  end
  local out = {1, 0}
  for _, v in ipairs(redis.call('HGETALL', meta)) do out[#out + 1] = v end
  return out
end
if ARGV[1] == 'attach' then return {-1} end
local fields = {'created_ms', tostring(now_ms()), 'paused', '0'}
for i = 2, #ARGV, 3 do
  fields[#fields + 1] = ARGV[i]
  fields[#fields + 1] = ARGV[i + 1]
end
redis.call('HSET', meta, unpack(fields))
local out = {1, 1}
for _, v in ipairs(redis.call('HGETALL', meta)) do out[#out + 1] = v end
return out
