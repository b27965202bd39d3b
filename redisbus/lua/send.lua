-- send.lua: check every limit and append messages to a channel stream, atomically.
--
-- KEYS[1] stream   KEYS[2] meta    KEYS[3] parents   KEYS[4] status
-- KEYS[5] ids      KEYS[6] inbox   KEYS[7] rate      KEYS[8] idem
-- ARGV is one message or several, 13 fields each (ARGV[13 * (i - 1) + k] for message i):
-- k=1  sender name
-- k=2  mode: "one" (a single recipient: any refusal refuses the send),
--            "many" (a list: refusals are per recipient), "all" (broadcast to the reachable)
-- k=3  recipients, "\n"-separated: names, agent ids or "parent" (ignored for "all")
-- k=4  subject   k=5 body   k=6 type   k=7 priority (0, 1, 2)
-- k=8  reply_to entry id or ""   k=9 ttl (seconds) or ""
-- k=10 idempotency key or ""     k=11 trace context or ""
-- k=12 signature "kid:hex" or "" k=13 signed timestamp (ms) or ""
--
-- returns, for one message:
--         {0, code, message, limit, current, retry_after_ms}      the whole send is refused
--      or {1, id|false, {accepted...}, {name, code, message, limit, current, retry_ms, ...}}
--      or {2, id, {recipients...}}                                  idempotent replay
--   for several: a list of those, one per message, in order.
--
-- Messages are checked and appended in order, each seeing what the ones before it did (inbox
-- depths, token buckets, the budget, idempotency keys), exactly as separate sends would; they
-- share one read of the channel's limits, one clock reading and the member lookups. Nothing is
-- written for a refused message: every check runs before its writes. Each accepted message is
-- appended at once (a later one may reply to it); the counters of all of them (rate hash,
-- inbox depths, idempotency keys) are gathered and written once at the end.
--
-- Written for the hot path: each closure, table and string made here costs a fraction of a
-- microsecond on every send, so helpers are few and the one-recipient case allocates little.

local stream, meta, parents, status, ids, inbox, rate, idem =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local NF = 13
local count = #ARGV / NF
if count < 1 or count ~= math.floor(count) then
  return redis.error_reply('ERR send.lua takes 13 arguments per message')
end

local function refuse(code, msg, limit, current, retry_ms)
  return {0, code, msg, tostring(limit or ""), tostring(current or ""), tostring(retry_ms or "")}
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
  if not f[1] then
    local r = refuse('unknown_agent', 'no such channel')
    if count == 1 then return r end
    local out = {}
    for i = 1, count do out[i] = r end
    return out
  end
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

-- Redis clock, milliseconds: one reading for the whole call
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local now_s = string.format('%d', now)

-- What this call knows and will write. Sends change only the rate hash, the inbox depths,
-- the idempotency keys and the stream, so everything read here stays true for the call.
local cached, dirty, dirty_list = {}, {}, {}  -- rate hash: field -> value|false; to write
local status_of, parent_of = {}, {}           -- member -> status / parent name, false: none
local depth_of, depth_add, depth_list = {}, {}, {} -- inbox depth now; increments to write
local idem_of, idem_new = {}, {}              -- idempotency field -> "id\tto"|false; to write
local sent_any = false

local function rget(field)
  local v = cached[field]
  if v == nil then
    v = redis.call('HGET', rate, field) or false
    cached[field] = v
  end
  return v
end
local function rset(field, value)
  if not dirty[field] then
    dirty[field] = true
    dirty_list[#dirty_list + 1] = field
  end
  cached[field] = value
end
local function members(names, parents_known)  -- status and parent of names not looked up yet
  local need = nil
  for i = 1, #names do
    local name = names[i]
    if status_of[name] == nil then
      need = need or {}
      need[#need + 1] = name
      status_of[name] = false -- also marks it as being fetched (duplicates)
    end
  end
  if not need then return end
  local st = redis.call('HMGET', status, unpack(need))
  for i = 1, #need do status_of[need[i]] = st[i] or false end
  if parents_known then return end
  local pa = redis.call('HMGET', parents, unpack(need))
  for i = 1, #need do parent_of[need[i]] = pa[i] or false end
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

-- the counters of every appended message, in as few writes as possible
local function flush()
  if #dirty_list > 0 then
    local kv = {}
    for i, field in ipairs(dirty_list) do kv[2 * i - 1], kv[2 * i] = field, cached[field] end
    redis.call('HSET', rate, unpack(kv))
  end
  for _, name in ipairs(depth_list) do redis.call('HINCRBY', inbox, name, depth_add[name]) end
  if #idem_new > 0 then redis.call('HSET', idem, unpack(idem_new)) end
  if new_cfg and sent_any then redis.call('HSET', meta, 'cfg', new_cfg) end
end

-- each message in order; a refusal ends that message's turn (break) with its reply
local out = {}
for item = 1, count do
  local base, result = (item - 1) * NF, nil
  repeat
    local sender, mode, rcpt_arg = ARGV[base + 1], ARGV[base + 2], ARGV[base + 3]
    local subject, body, mtype, prio = ARGV[base + 4], ARGV[base + 5], ARGV[base + 6], ARGV[base + 7]
    local reply_to, ttl, ikey = ARGV[base + 8], ARGV[base + 9], ARGV[base + 10]
    local trace, sig, sig_ts = ARGV[base + 11], ARGV[base + 12], ARGV[base + 13]

    -- text rules: printable (no C0/C1 control characters), at most max_name characters
    if paused then result = refuse('channel_paused', 'channel is paused'); break end
    if #body > max_body then result = refuse('too_large', 'body is too large (bytes)', max_body, #body); break end
    if subject ~= '' then
      local _, n = string.gsub(subject, '[^\128-\191]', '')
      if n > max_name then
        result = refuse('too_large', 'subject is too long (characters)', max_name, n); break
      end
      if string.find(subject, '%c') or string.find(subject, '\194[\128-\159]') then
        result = refuse('invalid_input', 'subject has control characters'); break
      end
    end
    if #mtype > 32 or not string.find(mtype, '^[a-z_]+$') then
      result = refuse('invalid_input', 'bad message type'); break
    end
    if mtype == 'outcome' or mtype == 'control' then
      result = refuse('invalid_input', 'outcome and control messages are written by the bus only'); break
    end
    if prio ~= '0' and prio ~= '1' and prio ~= '2' then
      result = refuse('invalid_input', 'priority must be 0, 1 or 2'); break
    end
    if max_msgs > 0 then
      local sent = tonumber(rget('#sent') or '0')
      if sent >= max_msgs then
        result = refuse('budget', 'channel message budget spent', max_msgs, sent); break
      end
    end

    -- the sender's and the named recipients' status and parent, in one HMGET per hash (a
    -- broadcast reads the whole parents hash below instead)
    local names
    if mode == 'one' then
      names = {rcpt_arg}
      if rcpt_arg == 'parent' then members({sender}) else members({sender, rcpt_arg}) end
    else
      names = {}
      local lookup = {sender}
      if mode ~= 'all' then
        for name in string.gmatch(rcpt_arg, '[^\n]+') do
          names[#names + 1] = name
          if name ~= 'parent' then lookup[#lookup + 1] = name end
        end
      end
      members(lookup)
    end
    local sender_status = status_of[sender]
    if not sender_status then result = refuse('unknown_agent', 'sender is not a member'); break end
    if sender_status == 'failed' or sender_status == 'cancelled' then
      result = refuse('agent_closed', 'sender is ' .. sender_status); break
    end

    -- idempotent replay: the same sender and key return the first send's id
    local ifield = nil
    if ikey ~= '' then
      ifield = sender .. '\n' .. ikey
      local prev = idem_of[ifield]
      if prev == nil then
        prev = redis.call('HGET', idem, ifield) or false
        idem_of[ifield] = prev
      end
      if prev then
        local tab = string.find(prev, '\t', 1, true)
        local sent_to = {}
        for n in string.gmatch(string.sub(prev, tab + 1), '[^\n]+') do sent_to[#sent_to + 1] = n end
        result = {2, string.sub(prev, 1, tab - 1), sent_to}; break
      end
    end

    -- chain depth and the auto-reply rule
    local depth = 0
    if reply_to ~= '' then
      if not string.find(reply_to, '^%d+%-%d+$') then
        result = refuse('invalid_input', 'reply_to is not a message id'); break
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
          result = refuse('loop', 'an auto_reply never answers an auto_reply', 0, 1); break
        end
        if mtype == 'auto_reply'
          and string.find('\n' .. deny_list .. '\n', '\n' .. psender .. '\n', 1, true) then
          result = refuse('loop', 'no automatic answer to ' .. psender .. ' (deny-listed sender)', 0, 1); break
        end
      else
        depth = 1 -- the original was trimmed; count this as a first reply
      end
      if depth > max_chain then
        result = refuse('chain_too_deep', 'reply chain too deep', max_chain, depth); break
      end
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
            if r then result = r; break end
            resolved = nil
          else
            resolved = sp
          end
        elseif not parent_of[name] then
          resolved = redis.call('HGET', ids, name)
          if not resolved then
            local r = refuse_one(name, 'unknown_agent', 'no such agent: ' .. name)
            if r then result = r; break end
          end
        end
        if resolved and not seen[resolved] then
          seen[resolved] = true
          if resolved == sender then
            local r = refuse_one(resolved, 'invalid_input', 'an agent cannot send to itself')
            if r then result = r; break end
          else
            targets[#targets + 1] = resolved
          end
        end
      end
    end
    if result then break end

    -- the checks per recipient; what an accepted send will write collects in `writes`
    -- (field, value, ...), applied only once every check has passed
    local accepted, writes = {}, {}
    if #targets > 0 then
      -- status and parent of targets not read above (a broadcast's, an id's, "parent"'s)
      -- and the rate fields and inbox depths not read before, one HMGET each
      members(targets, mode == 'all') -- a broadcast has every parent from HGETALL
      local fields = {}
      local function want(f) if cached[f] == nil then fields[#fields + 1] = f end end
      want('s\n' .. sender)
      want('#sent')
      local need_depth = {}
      for _, name in ipairs(targets) do
        want('p\n' .. sender .. '\n' .. name)
        want('b\n' .. name)
        if dampen_turns > 0 and mode ~= 'all' then
          if name < sender then want('d\n' .. name .. '\n' .. sender)
          else want('d\n' .. sender .. '\n' .. name) end
        end
        if depth_of[name] == nil then
          need_depth[#need_depth + 1] = name
          depth_of[name] = 0
        end
      end
      if #fields > 0 then
        local vals = redis.call('HMGET', rate, unpack(fields))
        for i = 1, #fields do cached[fields[i]] = vals[i] or false end
      end
      if #need_depth > 0 then
        local vals = redis.call('HMGET', inbox, unpack(need_depth))
        for i = 1, #need_depth do depth_of[need_depth[i]] = tonumber(vals[i] or '0') end
      end
      for _, name in ipairs(targets) do
        local rel, ok = reach(name, parent_of[name] or '')
        local s = status_of[name]
        local queued = depth_of[name]
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
              writes[n + 1], writes[n + 2] = field, tokens .. ' ' .. now_s
              n = n + 2
            end
            if dfield then
              writes[n + 1], writes[n + 2] = dfield, sender .. ' ' .. turns .. ' ' .. now_s
            end
          end
        end
        if r then result = r; break end
      end
    end
    if result then break end

    if #accepted == 0 then
      if mode == 'one' then result = refuse('invalid_input', 'no recipient'); break end
      result = {1, false, {}, refused}; break
    end

    local s_ok, s_tokens, s_retry = bucket('s\n' .. sender, snd_burst, snd_rate)
    if not s_ok then
      result = refuse('rate_limited', 'sender rate limit for ' .. sender, snd_burst, s_tokens, s_retry); break
    end

    -- every check passed: append now, count (written at the end of the call)
    for i = 1, #writes, 2 do rset(writes[i], writes[i + 1]) end
    rset('#sent', tostring(tonumber(rget('#sent') or '0') + 1))
    if s_tokens then rset('s\n' .. sender, s_tokens .. ' ' .. now_s) end
    for _, name in ipairs(accepted) do
      if not depth_add[name] then
        depth_add[name] = 0
        depth_list[#depth_list + 1] = name
      end
      depth_add[name] = depth_add[name] + 1
      depth_of[name] = depth_of[name] + 1
    end
    local to = #accepted == 1 and accepted[1] or table.concat(accepted, '\n')
    local f = {'f', sender, 't', to, 'b', body}
    local n = 6
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
    sent_any = true
    if ifield then
      idem_of[ifield] = id .. '\t' .. to
      idem_new[#idem_new + 1] = ifield
      idem_new[#idem_new + 1] = idem_of[ifield]
    end
    result = {1, id, accepted, refused}
  until true
  out[item] = result
end
flush()
if count == 1 then return out[1] end
return out
