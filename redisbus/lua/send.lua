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

local stream, meta, parents, status, ids, inbox, rate, idem =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local sender, mode, rcpt_arg = ARGV[1], ARGV[2], ARGV[3]
local subject, body, mtype, prio = ARGV[4], ARGV[5], ARGV[6], ARGV[7]
local reply_to, ttl, ikey, trace, sig, sig_ts = ARGV[8], ARGV[9], ARGV[10], ARGV[11], ARGV[12], ARGV[13]

local function refuse(code, msg, limit, current, retry_ms)
  return {0, code, msg, tostring(limit or ""), tostring(current or ""), tostring(retry_ms or "")}
end

local m = redis.call('HMGET', meta, 'routing', 'siblings', 'paused', 'inbox_cap',
  'max_body_bytes', 'max_name_chars', 'pair_rate_burst', 'pair_rate_per_s',
  'sender_rate_burst', 'sender_rate_per_s', 'max_chain_depth', 'max_messages', 'sent',
  'dampen_turns', 'dampen_window_s', 'auto_reply_deny')
if not m[1] then return refuse('unknown_agent', 'no such channel') end
local routing, siblings, paused = m[1], m[2] == '1', m[3] == '1'
local inbox_cap, max_body, max_name = tonumber(m[4]), tonumber(m[5]), tonumber(m[6])
local pair_burst, pair_rate = tonumber(m[7]), tonumber(m[8])
local snd_burst, snd_rate = tonumber(m[9]), tonumber(m[10])
local max_chain, max_msgs, sent = tonumber(m[11]), tonumber(m[12]), tonumber(m[13] or '0')
local dampen_turns, dampen_window = tonumber(m[14] or '0'), tonumber(m[15] or '0') * 1000
local deny = '\n' .. (m[16] or '') .. '\n'

-- text rules: printable (no C0/C1 control characters), at most max_name characters
local function chars(s) local _, n = string.gsub(s, '[^\128-\191]', ''); return n end
local function bad_text(s)
  return string.find(s, '%c') or string.find(s, '\194[\128-\159]')
end

if paused then return refuse('channel_paused', 'channel is paused') end
if #body > max_body then return refuse('too_large', 'body is too large (bytes)', max_body, #body) end
if chars(subject) > max_name then
  return refuse('too_large', 'subject is too long (characters)', max_name, chars(subject))
end
if bad_text(subject) then return refuse('invalid_input', 'subject has control characters') end
if not string.find(mtype, '^[a-z_]+$') or #mtype > 32 then
  return refuse('invalid_input', 'bad message type')
end
if mtype == 'outcome' or mtype == 'control' then
  return refuse('invalid_input', 'outcome and control messages are written by the bus only')
end
if prio ~= '0' and prio ~= '1' and prio ~= '2' then
  return refuse('invalid_input', 'priority must be 0, 1 or 2')
end
if max_msgs > 0 and sent >= max_msgs then
  return refuse('budget', 'channel message budget spent', max_msgs, sent)
end

local sender_status = redis.call('HGET', status, sender)
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
    local names = {}
    for n in string.gmatch(string.sub(prev, tab + 1), '[^\n]+') do names[#names + 1] = n end
    return {2, string.sub(prev, 1, tab - 1), names}
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
    local f, ptype, pdepth = e[1][2], 'message', 0
    for i = 1, #f, 2 do
      if f[i] == 'k' then ptype = f[i + 1] elseif f[i] == 'd' then pdepth = tonumber(f[i + 1]) end
    end
    depth = pdepth + 1
    if mtype == 'auto_reply' and ptype == 'auto_reply' then
      return refuse('loop', 'an auto_reply never answers an auto_reply', 0, 1)
    end
    local psender = ''
    for i = 1, #f, 2 do if f[i] == 'f' then psender = f[i + 1] end end
    if mtype == 'auto_reply' and string.find(deny, '\n' .. psender .. '\n', 1, true) then
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

-- fields of the rate hash, fetched in one HMGET for all recipients (see prefetch below)
local cached = {}
local function rget(field)
  local v = cached[field]
  if v == nil then
    v = redis.call('HGET', rate, field) or false
    cached[field] = v
  end
  return v
end
local function prefetch(fields)
  if #fields == 0 then return end
  local vals = redis.call('HMGET', rate, unpack(fields))
  for i, f in ipairs(fields) do cached[f] = vals[i] or false end
end

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

-- circuit breaker (written by claim.lua / sweep.lua): ms until it closes, or nil
local function breaker_open(name)
  local v = rget('b\n' .. name)
  if not v then return nil end
  local until_ms = tonumber(string.match(v, ' (%d+)$') or '0')
  if until_ms > now then return until_ms - now end
  return nil
end

-- ping-pong dampener: turns of a back-and-forth between sender and `name`, when over limit
local dampen_updates = {}
local function pingpong(name)
  if dampen_turns <= 0 then return nil end
  local a, b = sender, name
  if b < a then a, b = b, a end
  local field = 'd\n' .. a .. '\n' .. b
  local v = rget(field)
  local turns = 0
  if v then
    local last, n, at = string.match(v, '^(.*) (%d+) (%d+)$')
    n, at = tonumber(n), tonumber(at)
    if now - at <= dampen_window then
      if last == name then turns = n + 1 else turns = n end
    end
  end
  if turns > dampen_turns then return turns end
  dampen_updates[#dampen_updates + 1] = {field, sender .. ' ' .. turns .. ' ' .. now}
  return nil
end

-- routing: may the sender reach `name` (whose parent is `np`)?
local sp = redis.call('HGET', parents, sender) or ''
local function relation(name, np)
  if np == sender then return 'child' end
  if name == sp and sp ~= '' then return 'parent' end
  if np == sp then return 'sibling' end
  return 'member'
end
local function reachable(rel)
  if routing == 'open' then return true end
  if rel == 'child' or rel == 'parent' then return true end
  return rel == 'sibling' and siblings
end

-- recipients, in order; duplicates dropped
local targets, seen = {}, {}
local refused = {}
local function refuse_one(name, code, msg, limit, current, retry_ms)
  if mode == 'one' then return refuse(code, msg, limit, current, retry_ms) end
  for _, x in ipairs({name, code, msg, tostring(limit or ''), tostring(current or ''),
                      tostring(retry_ms or '')}) do
    refused[#refused + 1] = x
  end
  return nil
end

if mode == 'all' then
  local flat = redis.call('HGETALL', parents)
  local groups = {parent = {}, sibling = {}, child = {}, member = {}}
  for i = 1, #flat, 2 do
    local name, np = flat[i], flat[i + 1]
    if name ~= sender then
      local rel = relation(name, np)
      if reachable(rel) then table.insert(groups[rel], name) end
    end
  end
  for _, rel in ipairs({'parent', 'sibling', 'child', 'member'}) do
    table.sort(groups[rel])
    for _, name in ipairs(groups[rel]) do targets[#targets + 1] = name end
  end
else
  for name in string.gmatch(rcpt_arg, '[^\n]+') do
    local resolved = name
    if name == 'parent' then
      if sp == '' then
        local r = refuse_one(name, 'unknown_agent', 'a root agent has no parent')
        if r then return r end
        resolved = nil
      else
        resolved = sp
      end
    elseif not redis.call('HGET', parents, name) then
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

local accepted, pair_updates = {}, {}
if #targets > 0 then
  local fields = {'s\n' .. sender}
  for _, name in ipairs(targets) do
    fields[#fields + 1] = 'p\n' .. sender .. '\n' .. name
    fields[#fields + 1] = 'b\n' .. name
  end
  prefetch(fields)
  local st = redis.call('HMGET', status, unpack(targets))
  local depth_now = redis.call('HMGET', inbox, unpack(targets))
  local tp = redis.call('HMGET', parents, unpack(targets))
  for i, name in ipairs(targets) do
    local rel = relation(name, tp[i] or '')
    local s = st[i]
    if not reachable(rel) then
      local r = refuse_one(name, 'routing_refused',
        name .. ' is outside ' .. sender .. "'s reach (" .. rel .. ')')
      if r then return r end
    elseif s == 'failed' or s == 'cancelled' or s == 'lost' then
      local r = refuse_one(name, 'recipient_closed', name .. ' is ' .. s)
      if r then return r end
    elseif tonumber(depth_now[i] or '0') >= inbox_cap then
      local r = refuse_one(name, 'inbox_full', name .. "'s inbox is full",
        inbox_cap, tonumber(depth_now[i] or '0'))
      if r then return r end
    elseif breaker_open(name) then
      local r = refuse_one(name, 'circuit_open', name .. ' keeps failing: deliveries paused',
        0, 0, breaker_open(name))
      if r then return r end
    elseif mode ~= 'all' and pingpong(name) then
      local r = refuse_one(name, 'loop', 'ping-pong between ' .. sender .. ' and ' .. name
        .. ' dampened', dampen_turns, pingpong(name), dampen_window)
      if r then return r end
    else
      local field = 'p\n' .. sender .. '\n' .. name
      local ok, tokens, retry = bucket(field, pair_burst, pair_rate)
      if not ok then
        local r = refuse_one(name, 'rate_limited', 'rate limit ' .. sender .. ' -> ' .. name,
          pair_burst, tokens, retry)
        if r then return r end
      else
        accepted[#accepted + 1] = name
        if tokens then pair_updates[#pair_updates + 1] = {field, tokens} end
      end
    end
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
local buckets = {}
if s_tokens then buckets = {'s\n' .. sender, s_tokens .. ' ' .. now} end
for _, u in ipairs(pair_updates) do
  buckets[#buckets + 1] = u[1]
  buckets[#buckets + 1] = u[2] .. ' ' .. now
end
for _, u in ipairs(dampen_updates) do
  buckets[#buckets + 1] = u[1]
  buckets[#buckets + 1] = u[2]
end
if #buckets > 0 then redis.call('HSET', rate, unpack(buckets)) end
for _, name in ipairs(accepted) do redis.call('HINCRBY', inbox, name, 1) end
local to = table.concat(accepted, '\n')
local fields = {'f', sender, 't', to, 'b', body}
local function opt(k, v, default) if v ~= default then fields[#fields + 1] = k; fields[#fields + 1] = v end end
opt('s', subject, '')
opt('k', mtype, 'message')
opt('p', prio, '0')
opt('r', reply_to, '')
if depth > 0 then opt('d', tostring(depth), '') end
opt('x', ttl, '')
opt('i', ikey, '')
opt('c', trace, '')
opt('g', sig, '')
opt('n', sig_ts, '')
if mode == 'all' then opt('a', '1', '') end
local id = redis.call('XADD', stream, '*', unpack(fields))
redis.call('HINCRBY', meta, 'sent', 1)
if ifield then redis.call('HSET', idem, ifield, id .. '\t' .. to) end
return {1, id, accepted, refused}
