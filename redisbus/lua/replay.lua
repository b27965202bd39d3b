-- replay.lua: give a dead letter back to its recipient as a new message, and drop it from
-- the dead-letter stream, atomically.
--
-- KEYS[1] stream  KEYS[2] inbox  KEYS[3] dlq  KEYS[4] status
-- KEYS[5..] bells: doorbells, in pairs: an agent's bell, then its wakeup list (see ring); the
--         recipient's must be there
-- ARGV[1] dead: the dead-letter entry id
-- ARGV[2] sig: the replay's signature ("" with signing off; optional, as ARGV[3])
-- ARGV[3] signed_at: its signing time (ms) or ""
--
-- returns {1, new entry id, recipient}  or  {0, code, message}
--      or {-1, recipient}: its doorbell was not in KEYS; nothing was written (call again
--         with it)
--
-- The replayed message keeps its sender, subject, body and type; it is a new entry (new id),
-- so receipts of the original stay "failed". Caps do not apply: it was accepted once.
--
-- Signed, it carries two signatures: the original sender's ('og', 'on': the dead-letter
-- stream keeps them under those names) over the content, and the replaying host's ('g', 'n',
-- mode "replay", for the recipient) over the same content, fresh: receivers check both
-- (_signing.Signer.check), so a replay is neither stale nor a copy, and still the sender's.

local stream, inbox, dlq, status = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local bells = doorbells(stream, KEYS, 5)
local dead_id = ARGV[1]
local e = redis.call('XRANGE', dlq, dead_id, dead_id)[1]
if not e then return {0, 'invalid_input', 'no dead letter ' .. dead_id} end
local recipient, fields, ns = nil, {}, 0
local skip = {o = true, w = true, dead_ms = true, t = true}
local f = e[2]
for i = 1, #f, 2 do
  local k, v = f[i], f[i + 1]
  if k == 'a' then recipient = v
  elseif k == 'n' then -- the deliveries; a dead letter written before 'on' existed carries
    ns = ns + 1        -- its original signing time as a second 'n'
    if ns == 2 then fields[#fields + 1] = 'on'; fields[#fields + 1] = v end
  elseif k == 'g' then fields[#fields + 1] = 'og'; fields[#fields + 1] = v
  elseif not skip[k] then fields[#fields + 1] = k; fields[#fields + 1] = v end
end
if not recipient then return {0, 'invalid_input', 'not a dead letter: ' .. dead_id} end
local s = redis.call('HGET', status, recipient)
if s == 'failed' or s == 'cancelled' or s == 'lost' or not s then
  return {0, 'recipient_closed', recipient .. ' cannot receive (' .. tostring(s) .. ')'}
end
local miss = undeclared(bells, {recipient}, 1)
if miss then return miss end
fields[#fields + 1] = 't'
fields[#fields + 1] = recipient
fields[#fields + 1] = 'rp'
fields[#fields + 1] = dead_id
if (ARGV[2] or '') ~= '' then
  fields[#fields + 1] = 'g'; fields[#fields + 1] = ARGV[2]
  fields[#fields + 1] = 'n'; fields[#fields + 1] = ARGV[3]
end
local id = redis.call('XADD', stream, '*', unpack(fields))
count_in(inbox, recipient, 1)
ring(bells, recipient, id)
redis.call('XDEL', dlq, dead_id)
return {1, id, recipient}
