-- configure.lua: change a channel's stored configuration (limits, pause switch) in one step.
--
-- KEYS[1] meta   KEYS[2] limits (the string where older versions of send.lua cached meta's
--                limits and pause switch)
-- KEYS[3] rate   (send.lua's packed copy of meta's limits and pause switch: field '#lim')
-- ARGV[1..] pairs: field, value
--
-- returns {1, field, value, ...}   meta after the change
--      or {0, 'unknown_agent', message}   no such channel (nothing written)
--
-- Writing meta and dropping the packed copies are one atomic step, so no crash or dropped
-- connection can leave a change (a pause) that sends do not see: every send after it, from
-- any host, repacks the copy from meta. The older versions' copy goes too, so that a host
-- not upgraded yet sees the change as well.

local meta, lim, rate = KEYS[1], KEYS[2], KEYS[3]
if redis.call('EXISTS', meta) == 0 then return {0, 'unknown_agent', 'no such channel'} end
if #ARGV > 0 then redis.call('HSET', meta, unpack(ARGV)) end
redis.call('DEL', lim)
redis.call('HDEL', rate, '#lim')
local out = {1}
for _, v in ipairs(redis.call('HGETALL', meta)) do out[#out + 1] = v end
return out
