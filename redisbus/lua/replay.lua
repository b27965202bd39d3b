-- replay.lua: give a dead letter back to its recipient as a new message, and drop it from
-- the dead-letter stream, atomically.
--
-- KEYS[1] stream  KEYS[2] inbox  KEYS[3] dlq  KEYS[4] status
-- ARGV[1] dead-letter entry id
--
-- returns {1, new entry id, recipient}  or  {0, code, message}
--
-- The replayed message keeps its sender, subject, body and type; it is a new entry (new id),
-- so receipts of the original stay "failed". Caps do not apply: it was accepted once.

local stream, inbox, dlq, status, dead_id = KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[1]
local e = redis.call('XRANGE', dlq, dead_id, dead_id)[1]
if not e then return {0, 'invalid_input', 'no dead letter ' .. dead_id} end
local recipient, fields = nil, {}
local skip = {o = true, a = true, n = true, w = true, dead_ms = true, t = true}
local f = e[2]
for i = 1, #f, 2 do
  if f[i] == 'a' then recipient = f[i + 1] end
  if not skip[f[i]] then fields[#fields + 1] = f[i]; fields[#fields + 1] = f[i + 1] end
end
local s = redis.call('HGET', status, recipient)
if s == 'failed' or s == 'cancelled' or s == 'lost' or not s then
  return {0, 'recipient_closed', recipient .. ' cannot receive (' .. tostring(s) .. ')'}
end
fields[#fields + 1] = 't'
fields[#fields + 1] = recipient
fields[#fields + 1] = 'rp'
fields[#fields + 1] = dead_id
local id = redis.call('XADD', stream, '*', unpack(fields))
redis.call('HINCRBY', inbox, recipient, 1)
redis.call('XDEL', dlq, dead_id)
return {1, id, recipient}
