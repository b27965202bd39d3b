-- outcome.lua: an agent's end (complete, fail), its cancellation by its parent, or its loss
-- (no replica heartbeat within the lease). Outcomes flow to the parent as attributed messages.
--
-- KEYS[1] stream  KEYS[2] parents  KEYS[3] status  KEYS[4] inbox
-- KEYS[5..] bells: doorbells, in pairs: an agent's bell, then its wakeup list (see ring); those
--         of every agent it writes to must be there
-- ARGV[1] op: "complete" | "fail" | "cancel" | "lost"
-- ARGV[2] actor: the agent calling (for "cancel", the parent; otherwise the agent itself)
-- ARGV[3] target agent   ARGV[4] text: summary, error or reason
-- ARGV[5] sig: the outcome message's signature or ""
-- ARGV[6] control_sig: the control message's signature or ""
-- ARGV[7] signed_at: the signing time (ms) or ""
--         (see _signing.py; the client signs what this writes)
-- ARGV[8] known: "known" when the call is made again after a {-1, ...} reply (optional): a
--         descendant whose doorbell it is not given joined since the first try; it is
--         cancelled all the same, and learns it from its status (a wait's quiet slice, a
--         heartbeat) instead of from the control message, so joins never make it ask again
--
-- returns {0, code, message}   refused
--      or {1, outcome entry id or "", control entry id or "", cancelled count}
--      or {-1, name, ...}: the agents it would write to whose doorbells were not in KEYS;
--         nothing was written (call again with them, and "known")
--
-- "fail", "cancel" and "lost" cancel the target's descendants: their status becomes
-- "cancelled" and one control message (subject "cancel") wakes every one of them, on any host.
--
-- Statuses go one way (docs/delivery.md has the table): running, waiting and idle are open;
-- completed, failed, cancelled and lost are terminal, and a terminal agent's status never
-- changes again, so its parent gets exactly one outcome. A second complete() changes nothing;
-- fail() after the end is refused; cancelling a completed child cancels its open descendants
-- and leaves it completed; a cascade passes over terminal descendants.
-- Only the subtree root's outcome reaches a surviving parent; the descendants' parents are
-- themselves cancelled. Outcomes and control messages bypass caps and rates: they are never lost.

local stream, parents, status, inbox = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local bells = doorbells(stream, KEYS, 5)
local op, actor, target, text = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local outcome_sig, control_sig, sig_ts = ARGV[5] or '', ARGV[6] or '', ARGV[7] or ''
local known = ARGV[8] == 'known'
local function signed(fields, sig)
  if sig ~= '' then
    fields[#fields + 1] = 'g'; fields[#fields + 1] = sig
    fields[#fields + 1] = 'n'; fields[#fields + 1] = sig_ts
  end
  return fields
end

local st = redis.call('HGET', status, target)
if not st then return {0, 'unknown_agent', 'no such agent: ' .. target} end
local parent = redis.call('HGET', parents, target) or ''
local open = (st == 'running' or st == 'waiting' or st == 'idle')
local new_status = ({complete = 'completed', fail = 'failed', cancel = 'cancelled', lost = 'lost'})[op]
if not new_status then return {0, 'invalid_input', 'unknown op ' .. op} end

if op == 'cancel' then
  if parent ~= actor then
    return {0, 'not_permitted', 'only the parent of ' .. target .. ' may cancel it'}
  end
  -- a completed child keeps its status (its parent has its outcome); what it started is
  -- cancelled all the same
  if not open and st ~= 'completed' then return {1, '', '', 0} end
elseif op == 'lost' then
  if not open then return {1, '', '', 0} end
else
  if actor ~= target then return {0, 'not_permitted', 'an agent reports only its own outcome'} end
  if st == 'completed' and op == 'complete' then return {1, '', '', 0} end -- said once
  if not open then return {0, 'agent_closed', target .. ' is already ' .. st} end
end

if not open then new_status = nil end

-- descendants to cancel (not for "complete": a completed agent's children live on), found
-- before anything is written (the doorbells of all it writes to are checked first)
local victims = {}
if op ~= 'complete' then
  local flat = redis.call('HGETALL', parents)
  local children = {}
  for i = 1, #flat, 2 do
    local p = flat[i + 1]
    if p ~= '' then
      children[p] = children[p] or {}
      table.insert(children[p], flat[i])
    end
  end
  local queue, head = {target}, 1
  while queue[head] do
    local n = queue[head]
    head = head + 1
    for _, c in ipairs(children[n] or {}) do
      local cs = redis.call('HGET', status, c)
      if cs == 'running' or cs == 'waiting' or cs == 'idle' then
        victims[#victims + 1] = c
      end
      queue[#queue + 1] = c
    end
  end
end

-- one control message wakes the cancelled subtree (the target too, when it was cancelled);
-- the outcome goes to a parent that can still receive it
local wake = {}
if new_status and (op == 'cancel' or op == 'lost') then wake[1] = target end
for _, v in ipairs(victims) do
  if bells[v] or not known then wake[#wake + 1] = v end -- ("known": see ARGV[8])
end
local to_parent = false
if parent ~= '' and new_status then
  local ps = redis.call('HGET', status, parent)
  to_parent = ps == 'running' or ps == 'waiting' or ps == 'idle' or ps == 'completed'
end
local written = {to_parent and parent or false}
for i, w in ipairs(wake) do written[i + 1] = w end
local miss = undeclared(bells, written, #wake + 1)
if miss then return miss end

if new_status then redis.call('HSET', status, target, new_status) end
for _, v in ipairs(victims) do redis.call('HSET', status, v, 'cancelled') end
local control_id = ''
if #wake > 0 then
  control_id = redis.call('XADD', stream, '*', unpack(signed({'f', actor,
    't', table.concat(wake, '\n'), 'b', text, 's', 'cancel', 'k', 'control'}, control_sig)))
  for _, w in ipairs(wake) do count_in(inbox, w, 1) end
  ring(bells, table.concat(wake, '\n'), control_id)
end

local outcome_id = ''
if to_parent then
  outcome_id = redis.call('XADD', stream, '*', unpack(signed({'f', target, 't', parent,
    'b', text, 's', new_status, 'k', 'outcome'}, outcome_sig)))
  count_in(inbox, parent, 1)
  ring(bells, parent, outcome_id)
end
return {1, outcome_id, control_id, #victims}
