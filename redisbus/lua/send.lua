-- send.lua: check every limit and append one message to a channel stream, atomically.
--
-- KEYS[1] stream   KEYS[2] meta    KEYS[3] parents   KEYS[4] status
-- KEYS[5] ids      KEYS[6] inbox   KEYS[7] rate      KEYS[8] idem
-- ARGV[1]  sender name
-- ARGV[2]  mode: "one" (a single recipient: any refusal refuses the send),
--                "many" (a list: refusals are per recipient), "all" (broadcast to the reachable)
-- ARGV[3]  recipients, "\n"-separated: names, agent ids or "parent" (ignored for "all")
-- ARGV[4]  subject   ARGV[5] body   ARGV[6] type   ARGV[7] priority (0, 1, 2)
-- ARGV[8]  reply_to entry id or ""   ARGV[9] ttl (seconds) or ""
-- ARGV[10] idempotency key or ""     ARGV[11] trace context or ""
-- ARGV[12] signature "kid:hex" or "" ARGV[13] signed timestamp (ms) or ""
--
-- returns {0, code, message, limit, current, retry_after_ms}      the whole send is refused
--      or {1, id|false, {accepted...}, {name, code, message, limit, current, retry_ms, ...}}
--      or {2, id, {recipients...}}                                  idempotent replay
--
-- Nothing is written unless the send is accepted: every check runs before the first write.
--
-- Written for the hot path: each closure, table and string made here costs a fraction of a
-- microsecond on every send, so helpers are few and the one-recipient case allocates little.

local stream, meta, parents, status, ids, inbox, rate, idem =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local sender, mode, rcpt_arg = ARGV[1], ARGV[2], ARGV[3]
local subject, body, mtype, prio = ARGV[4], ARGV[5], ARGV[6], ARGV[7]
local reply_to, ttl, ikey, trace, sig, sig_ts = ARGV[8], ARGV[9], ARGV[10], ARGV[11], ARGV[12], ARGV[13]

local function refuse(code, msg, limit, current, retry_ms)
  return {0, code, msg, tostring(limit or ""), tostring(current or ""), tostring(retry_ms or "")}
end

-- fields of the rate hash (buckets, breakers, dampeners, the sent count), read once each:
-- most in one HMGET before the recipient checks, the rest by rget() on first use
local cached = {}
local function rget(field)
  local v = cached[field]
  if v == nil then
    v = redis.call('HGET', rate, field) or false
    cached[field] = v
  end
  return v
end

-- The channel's limits, packed in the meta field "cfg" by the first accepted send (one
-- field to read instead of fourteen); configure() deletes it when it changes a limit.
local m = redis.call('HMGET', meta, 'cfg', 'paused')
local paused, cfg, new_cfg = m[2] == '1', m[1], nil
if not cfg then
  local names = {'routing', 'siblings', 'inbox_cap', 'max_body_bytes', 'max_name_chars',
    'pair_rate_burst', 'pair_rate_per_s', 'sender_rate_burst', 'sender_rate_per_s',
    'max_chain_depth', 'max_messages', 'dampen_turns', 'dampen_window_s', 'auto_reply_deny'}
  local f = redis.call('HMGET', meta, unpack(names))
  if not f[1] then return refuse('unknown_agent', 'no such channel') end
  for i = 1, #names do f[i] = f[i] or '' end
  cfg = table.concat(f, '\t', 1, #names) -- no tabs in values: names are printable
  new_cfg = cfg
end
local routing, sib, cap, mb, mn, pb, pr, sb, sr, mc, mm, dt, dw, deny_list = string.match(cfg,
  '^([^\t]*)\t([^\t]*)\t([^\t]*)\t([^\t]*)\t([^\t]*)\t([^\t]*)\t([^\t]*)\t'
  .. '([^\t]*)\t([^\t]*)\t([^\t]*)\t([^\t]*)\t([^\t]*)\t([^\t]*)\t(.*)$')
local siblings, open_routing = sib == '1', routing == 'open'
local inbox_cap, max_body, max_name = tonumber(cap), tonumber(mb), tonumber(mn)
local pair_burst, pair_rate = tonumber(pb), tonumber(pr)
local snd_burst, snd_rate = tonumber(sb), tonumber(sr)
local max_chain, max_msgs = tonumber(mc), tonumber(mm)
local dampen_turns, dampen_window = tonumber(dt) or 0, (tonumber(dw) or 0) * 1000

-- text rules: printable (no C0/C1 control characters), at most max_name characters
if paused then return refuse('channel_paused', 'channel is paused') end
if #body > max_body then return refuse('too_large', 'body is too large (bytes)', max_body, #body) end
if subject ~= '' then
  local _, n = string.gsub(subject, '[^\128-\191]', '')
  if n > max_name then
    return refuse('too_large', 'subject is too long (characters)', max_name, n)
  end
  if string.find(subject, '%c') or string.find(subject, '\194[\128-\159]') then
    return refuse('invalid_input', 'subject has control characters')
  end
end
if #mtype > 32 or not string.find(mtype, '^[a-z_]+$') then
  return refuse('invalid_input', 'bad message type')
end
if mtype == 'outcome' or mtype == 'control' then
  return refuse('invalid_input', 'outcome and control messages are written by the bus only')
end
if prio ~= '0' and prio ~= '1' and prio ~= '2' then
  return refuse('invalid_input', 'priority must be 0, 1 or 2')
end
if max_msgs > 0 then
  local sent = tonumber(rget('#sent') or '0')
  if sent >= max_msgs then
    return refuse('budget', 'channel message budget spent', max_msgs, sent)
  end
end

-- the sender's and the named recipients' status and parent, in one HMGET per hash
-- (a broadcast reads the whole parents hash below instead)
local status_of, parent_of = {}, {}
local names
do
  local lookup
  if mode == 'one' then
    names = {rcpt_arg}
    lookup = rcpt_arg == 'parent' and {sender} or {sender, rcpt_arg}
  else
    names, lookup = {}, {sender}
    if mode ~= 'all' then
      for name in string.gmatch(rcpt_arg, '[^\n]+') do
        names[#names + 1] = name
        if name ~= 'parent' then lookup[#lookup + 1] = name end
      end
    end
  end
  local st = redis.call('HMGET', status, unpack(lookup))
  local pa = redis.call('HMGET', parents, unpack(lookup))
  for i = 1, #lookup do status_of[lookup[i]], parent_of[lookup[i]] = st[i], pa[i] end
end
local sender_status = status_of[sender]
if not sender_status then return refuse('unknown_agent', 'sender is not a member') end
if sender_status == 'failed' or sender_status == 'cancelled' then
  return refuse('agent_closed', 'sender is ' .. sender_status)
end

-- idempotent replay: the same sender and key return the first send's id
local ifield = nil
if ikey ~= '' then
  ifield = sender .. '\n' .. ikey
  local prev = redis.call('HGET', idem, ifield)
  if prev then
    local tab = string.find(prev, '\t', 1, true)
    local sent_to = {}
    for n in string.gmatch(string.sub(prev, tab + 1), '[^\n]+') do sent_to[#sent_to + 1] = n end
    return {2, string.sub(prev, 1, tab - 1), sent_to}
  end
end

-- chain depth and the auto-reply rule
local depth = 0
if reply_to ~= '' then
  if not string.find(reply_to, '^%d+%-%d+$') then
    return refuse('invalid_input', 'reply_to is not a message id')
  end
  local e = redis.call('XRANGE', stream, reply_to, reply_to)
  if e[1] then
    local f, ptype, pdepth, psender = e[1][2], 'message', 0, ''
    for i = 1, #f, 2 do
      local k = f[i]
      if k == 'k' then ptype = f[i + 1]
      elseif k == 'd' then pdepth = tonumber(f[i + 1])
      elseif k == 'f' then psender = f[i + 1] end
    end
    depth = pdepth + 1
    if mtype == 'auto_reply' and ptype == 'auto_reply' then
      return refuse('loop', 'an auto_reply never answers an auto_reply', 0, 1)
    end
    if mtype == 'auto_reply'
      and string.find('\n' .. deny_list .. '\n', '\n' .. psender .. '\n', 1, true) then
      return refuse('loop', 'no automatic answer to ' .. psender .. ' (deny-listed sender)', 0, 1)
    end
  else
    depth = 1 -- the original was trimmed; count this as a first reply
  end
  if depth > max_chain then
    return refuse('chain_too_deep', 'reply chain too deep', max_chain, depth)
  end
end

-- Redis clock, milliseconds
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- token bucket: returns ok, tokens_after, retry_ms (nothing written)
local function bucket(field, burst, per_s)
  if burst <= 0 or per_s <= 0 then return true, nil, 0 end
  local v = rget(field)
  local tokens, last = burst, now
  if v then
    local sp = string.find(v, ' ', 1, true)
    tokens, last = tonumber(string.sub(v, 1, sp - 1)), tonumber(string.sub(v, sp + 1))
    tokens = math.min(burst, tokens + math.max(0, now - last) * per_s / 1000)
  end
  if tokens < 1 then
    return false, tokens, math.ceil((1 - tokens) * 1000 / per_s)
  end
  return true, tokens - 1, 0
end

-- routing: may the sender reach `name` (whose parent is `np`)? returns relation, allowed
local sp = parent_of[sender] or ''
local function reach(name, np)
  local rel = 'member'
  if np == sender then rel = 'child'
  elseif name == sp and sp ~= '' then rel = 'parent'
  elseif np == sp then rel = 'sibling' end
  if open_routing or rel == 'child' or rel == 'parent' then return rel, true end
  return rel, rel == 'sibling' and siblings
end

-- recipients, in order; duplicates dropped
local targets = {}
local refused = {}
local function refuse_one(name, code, msg, limit, current, retry_ms)
  if mode == 'one' then return refuse(code, msg, limit, current, retry_ms) end
  local n = #refused
  refused[n + 1], refused[n + 2], refused[n + 3] = name, code, msg
  refused[n + 4], refused[n + 5] = tostring(limit or ''), tostring(current or '')
  refused[n + 6] = tostring(retry_ms or '')
  return nil
end

if mode == 'all' then
  local flat = redis.call('HGETALL', parents)
  local groups = {parent = {}, sibling = {}, child = {}, member = {}}
  for i = 1, #flat, 2 do
    local name, np = flat[i], flat[i + 1]
    parent_of[name] = np
    if name ~= sender then
      local rel, ok = reach(name, np)
      if ok then local g = groups[rel]; g[#g + 1] = name end
    end
  end
  for _, rel in ipairs({'parent', 'sibling', 'child', 'member'}) do
    table.sort(groups[rel])
    for _, name in ipairs(groups[rel]) do targets[#targets + 1] = name end
  end
else
  local seen = {}
  for _, name in ipairs(names) do
    local resolved = name
    if name == 'parent' then
      if sp == '' then
        local r = refuse_one(name, 'unknown_agent', 'a root agent has no parent')
        if r then return r end
        resolved = nil
      else
        resolved = sp
      end
    elseif not parent_of[name] then
      resolved = redis.call('HGET', ids, name)
      if not resolved then
        local r = refuse_one(name, 'unknown_agent', 'no such agent: ' .. name)
        if r then return r end
      end
    end
    if resolved and not seen[resolved] then
      seen[resolved] = true
      if resolved == sender then
        local r = refuse_one(resolved, 'invalid_input', 'an agent cannot send to itself')
        if r then return r end
      else
        targets[#targets + 1] = resolved
      end
    end
  end
end

-- the checks per recipient; what an accepted send will write to the rate hash collects in
-- `writes` (field, value, ...), written only once every check has passed
local accepted, writes = {}, {}
if #targets > 0 then
  local fields = {'s\n' .. sender, '#sent'}
  for _, name in ipairs(targets) do
    fields[#fields + 1] = 'p\n' .. sender .. '\n' .. name
    fields[#fields + 1] = 'b\n' .. name
    if dampen_turns > 0 and mode ~= 'all' then
      if name < sender then
        fields[#fields + 1] = 'd\n' .. name .. '\n' .. sender
      else
        fields[#fields + 1] = 'd\n' .. sender .. '\n' .. name
      end
    end
  end
  local vals = redis.call('HMGET', rate, unpack(fields))
  for i = 1, #fields do cached[fields[i]] = vals[i] or false end
  -- status and parent of targets not read above: a broadcast's, an id's, "parent"'s
  local unknown = nil
  for _, name in ipairs(targets) do
    if status_of[name] == nil then
      unknown = unknown or {}
      unknown[#unknown + 1] = name
    end
  end
  if unknown then
    local st = redis.call('HMGET', status, unpack(unknown))
    for i = 1, #unknown do status_of[unknown[i]] = st[i] end
    if mode ~= 'all' then -- a broadcast knows every parent from HGETALL
      local pa = redis.call('HMGET', parents, unpack(unknown))
      for i = 1, #unknown do parent_of[unknown[i]] = pa[i] end
    end
  end
  local depth_now = redis.call('HMGET', inbox, unpack(targets))
  for i, name in ipairs(targets) do
    local rel, ok = reach(name, parent_of[name] or '')
    local s = status_of[name]
    local queued = tonumber(depth_now[i] or '0')
    local r = nil
    -- circuit breaker (written by claim.lua / sweep.lua): "failures first until_ms"
    local brk = rget('b\n' .. name)
    local brk_ms = brk and (tonumber(string.match(brk, ' (%d+)$') or '0') - now) or 0
    -- ping-pong dampener: "last_sender turns at_ms" per unordered pair
    local dfield, turns = nil, 0
    if dampen_turns > 0 and mode ~= 'all' then
      if name < sender then dfield = 'd\n' .. name .. '\n' .. sender
      else dfield = 'd\n' .. sender .. '\n' .. name end
      local v = rget(dfield)
      if v then
        local last, n, at = string.match(v, '^(.*) (%d+) (%d+)$')
        if now - tonumber(at) <= dampen_window then
          turns = tonumber(n)
          if last == name then turns = turns + 1 end
        end
      end
    end
    if not ok then
      r = refuse_one(name, 'routing_refused',
        name .. ' is outside ' .. sender .. "'s reach (" .. rel .. ')')
    elseif s == 'failed' or s == 'cancelled' or s == 'lost' then
      r = refuse_one(name, 'recipient_closed', name .. ' is ' .. s)
    elseif queued >= inbox_cap then
      r = refuse_one(name, 'inbox_full', name .. "'s inbox is full", inbox_cap, queued)
    elseif brk_ms > 0 then
      r = refuse_one(name, 'circuit_open', name .. ' keeps failing: deliveries paused',
        0, 0, brk_ms)
    elseif turns > dampen_turns then
      r = refuse_one(name, 'loop', 'ping-pong between ' .. sender .. ' and ' .. name
        .. ' dampened', dampen_turns, turns, dampen_window)
    else
      local field = 'p\n' .. sender .. '\n' .. name
      local pass, tokens, retry = bucket(field, pair_burst, pair_rate)
      if not pass then
        r = refuse_one(name, 'rate_limited', 'rate limit ' .. sender .. ' -> ' .. name,
          pair_burst, tokens, retry)
      else
        accepted[#accepted + 1] = name
        local n = #writes
        if tokens then
          writes[n + 1], writes[n + 2] = field, tokens .. ' ' .. now
          n = n + 2
        end
        if dfield then writes[n + 1], writes[n + 2] = dfield, sender .. ' ' .. turns .. ' ' .. now end
      end
    end
    if r then return r end
  end
end

if #accepted == 0 then
  if mode == 'one' then return refuse('invalid_input', 'no recipient') end
  return {1, false, {}, refused}
end

local s_ok, s_tokens, s_retry = bucket('s\n' .. sender, snd_burst, snd_rate)
if not s_ok then
  return refuse('rate_limited', 'sender rate limit for ' .. sender, snd_burst, s_tokens, s_retry)
end

-- every check passed: write
local n = #writes
writes[n + 1], writes[n + 2] = '#sent', tonumber(rget('#sent') or '0') + 1
if s_tokens then writes[n + 3], writes[n + 4] = 's\n' .. sender, s_tokens .. ' ' .. now end
redis.call('HSET', rate, unpack(writes))
if new_cfg then redis.call('HSET', meta, 'cfg', new_cfg) end
for _, name in ipairs(accepted) do redis.call('HINCRBY', inbox, name, 1) end
local to = #accepted == 1 and accepted[1] or table.concat(accepted, '\n')
local f = {'f', sender, 't', to, 'b', body}
n = 6
if subject ~= '' then f[n + 1], f[n + 2], n = 's', subject, n + 2 end
if mtype ~= 'message' then f[n + 1], f[n + 2], n = 'k', mtype, n + 2 end
if prio ~= '0' then f[n + 1], f[n + 2], n = 'p', prio, n + 2 end
if reply_to ~= '' then f[n + 1], f[n + 2], n = 'r', reply_to, n + 2 end
if depth > 0 then f[n + 1], f[n + 2], n = 'd', tostring(depth), n + 2 end
if ttl ~= '' then f[n + 1], f[n + 2], n = 'x', ttl, n + 2 end
if ikey ~= '' then f[n + 1], f[n + 2], n = 'i', ikey, n + 2 end
if trace ~= '' then f[n + 1], f[n + 2], n = 'c', trace, n + 2 end
if sig ~= '' then f[n + 1], f[n + 2], n = 'g', sig, n + 2 end
if sig_ts ~= '' then f[n + 1], f[n + 2], n = 'n', sig_ts, n + 2 end
if mode == 'all' then f[n + 1], f[n + 2], n = 'a', '1', n + 2 end
local id = redis.call('XADD', stream, '*', unpack(f))
if ifield then redis.call('HSET', idem, ifield, id .. '\t' .. to) end
return {1, id, accepted, refused}
