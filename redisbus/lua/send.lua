-- send.lua: check every limit and append messages to a channel stream, atomically.
--
-- KEYS[1] stream   KEYS[2] meta    KEYS[3] parents   KEYS[4] status
-- KEYS[5] ids      KEYS[6] inbox   KEYS[7] rate      KEYS[8] idem
-- KEYS[9] limits (a cache of meta's limits and pause switch, which send.lua fills)
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
--      or {1, id, name}                               a "one" send, accepted (flat: cheaper)
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
-- Written for the hot path, where the Lua itself cost more than the Redis commands it calls:
-- library functions are locals, every function, table and string made here is made once per
-- call (not per message or recipient), the limits come from one MessagePack field (one C call,
-- numbers already numbers) and the common cases skip the pattern matching they cannot fail.
-- The commonest send of all (one plain message to one member, named) has a path of
-- its own that reads and writes only what it needs and never refuses: when a check does not
-- pass, it steps aside and the general loop decides. In a batch, the same messages take
-- plain(), its twin working from what the batch read up front. tests/test_send_batch.py
-- proves the three alike: random sends as a batch, one by one, and one by one with each
-- recipient in a list of one (which only the general loop takes).

local call, tonumber, tostring, find, match, gsub = redis.call, tonumber, tostring,
  string.find, string.match, string.gsub
local floor, ceil, min, unpack, type = math.floor, math.ceil, math.min, unpack, type

local stream, meta, parents, status, ids, inbox, rate, idem, lim =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local NF = 13
local count = #ARGV / NF
if count < 1 or count ~= floor(count) then
  return redis.error_reply('ERR send.lua takes 13 arguments per message')
end

local function refuse(code, msg, limit, current, retry_ms)
  return {0, code, msg, tostring(limit or ""), tostring(current or ""), tostring(retry_ms or "")}
end

-- The channel's limits and pause switch, packed (MessagePack) in the limits key by the first
-- accepted send: one GET and one C call to unpack, instead of fifteen hash fields to read and
-- convert. configure(), pause() and resume() delete the key with their change to meta (one
-- script, configure.lua). The in-memory test double (fakeredis) has no cmsgpack: there the
-- key holds the values tab-separated.
local pack_cfg, unpack_cfg
if cmsgpack then
  pack_cfg, unpack_cfg = cmsgpack.pack, cmsgpack.unpack
else
  pack_cfg = function(...)
    local v = {...}
    for i = 1, 15 do v[i] = v[i] == nil and '' or tostring(v[i]) end
    return table.concat(v, '\t')
  end
  unpack_cfg = function(text)
    local v = {match(text, '^' .. string.rep('([^\t]*)\t', 14) .. '(.*)$')}
    for i = 3, 13 do v[i] = tonumber(v[i]) end
    v[15] = tonumber(v[15])
    return unpack(v, 1, 15)
  end
end
local cfg, new_cfg = call('GET', lim), nil
if not cfg then
  local f = call('HMGET', meta, 'routing', 'siblings', 'inbox_cap', 'max_body_bytes',
    'max_name_chars', 'pair_rate_burst', 'pair_rate_per_s', 'sender_rate_burst',
    'sender_rate_per_s', 'max_chain_depth', 'max_messages', 'dampen_turns', 'dampen_window_s',
    'auto_reply_deny', 'paused')
  if not f[1] then
    local r = refuse('unknown_agent', 'no such channel')
    if count == 1 then return r end
    local out = {}
    for i = 1, count do out[i] = r end
    return out
  end
  cfg = pack_cfg(f[1], f[2] or '', tonumber(f[3]), tonumber(f[4]), tonumber(f[5]),
    tonumber(f[6]), tonumber(f[7]), tonumber(f[8]), tonumber(f[9]), tonumber(f[10]),
    tonumber(f[11]), tonumber(f[12]) or 0, (tonumber(f[13]) or 0) * 1000, f[14] or '',
    f[15] == '1' and 1 or 0)
  new_cfg = cfg
end
-- With the limits cached, the rate hash gets its '#table' field: a value longer than Redis'
-- hash-max-listpack-value (64 bytes by default) keeps the hash a hash table. Kept as a list
-- (up to 128 fields), every field a broadcast writes would be a scan of the whole hash.
local function store_cfg()
  call('SET', lim, new_cfg)
  call('HSET', rate, '#table',
    'over 64 bytes, so Redis keeps this hash a table: one lookup per field, not a scan of all')
end
local routing, sib, inbox_cap, max_body, max_name, pair_burst, pair_rate, snd_burst, snd_rate,
  max_chain, max_msgs, dampen_turns, dampen_window, deny_list, paused_flag = unpack_cfg(cfg)
local paused = paused_flag == 1
local siblings, open_routing = sib == '1', routing == 'open'
local family = not open_routing

-- Redis clock, milliseconds: one reading for the whole call (a 13-digit integer, which Lua
-- writes out in full wherever it is concatenated)
local t = call('TIME')
local now = t[1] * 1000 + floor(t[2] / 1000)
local now_s = now .. '' -- converted once: number to string is one of Lua's slower steps
-- the same numbers recur across a broadcast's recipients (full buckets, equal inbox depths):
-- each is converted once per call
local digits, bucket_values = {}, {}
local function str(n)
  local s = digits[n]
  if not s then s = n .. ''; digits[n] = s end
  return s
end
local function bucket_value(tokens) -- "tokens now_ms"
  local s = bucket_values[tokens]
  if not s then s = tokens .. ' ' .. now_s; bucket_values[tokens] = s end
  return s
end

-- token bucket "tokens last_ms": returns ok, tokens_after, retry_ms (nothing written). The
-- last value parsed is kept: a broadcast's pair buckets, written in one call, hold one value.
-- A bucket a batch's plain() wrote in this call is a table {tokens} (its time is now), turned
-- into text once, when the call writes its counters.
local seen_v, seen_tk, seen_last = nil, 0, 0
local function bucket(v, burst, per_s)
  if burst <= 0 or per_s <= 0 then return true, nil, 0 end
  local tokens = burst
  if type(v) == 'table' then
    tokens = min(burst, v[1])
  elseif v then
    if v ~= seen_v then
      local tk, last = match(v, '^(%S+) (%S+)$')
      seen_v, seen_tk, seen_last = v, tonumber(tk), tonumber(last)
    end
    tokens = min(burst, seen_tk + (now > seen_last and now - seen_last or 0) * per_s / 1000)
  end
  if tokens < 1 then
    return false, tokens, ceil((1 - tokens) * 1000 / per_s)
  end
  return true, tokens - 1, 0
end

-- Append the message at ARGV offset `base` to the stream, addressed to `to` (names joined by
-- "\n"), at reply-chain `depth`: the entry's one-letter fields, the optional ones only when
-- set. Returns the entry id.
local function append(base, to, depth, broadcast)
  local subject, mtype, prio = ARGV[base + 4], ARGV[base + 6], ARGV[base + 7]
  local reply_to, ttl, ikey = ARGV[base + 8], ARGV[base + 9], ARGV[base + 10]
  local trace, sig, sig_ts = ARGV[base + 11], ARGV[base + 12], ARGV[base + 13]
  local f, n = {'f', ARGV[base + 1], 't', to, 'b', ARGV[base + 5]}, 6
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
  if broadcast then f[n + 1], f[n + 2], n = 'a', '1', n + 2 end
  return call('XADD', stream, '*', unpack(f, 1, n))
end

-- ping-pong dampener "turns at_ms last_sender" of the pair: the turns this send would make
local function dampened(v, name)
  if not v then return 0 end
  local n, at, last = match(v, '^(%d+) (%d+) (.*)$')
  if not at or now - at > dampen_window then return 0 end
  if last == name then return n + 1 end
  return n + 0
end

-- may the sender (whose parent is sp) reach `name` (whose parent is `np`)? relation, allowed
local function reach(sender, sp, name, np)
  local rel = 'member'
  if np == sender then rel = 'child'
  elseif name == sp and sp ~= '' then rel = 'parent'
  elseif np == sp then rel = 'sibling' end
  if open_routing or rel == 'child' or rel == 'parent' then return rel, true end
  return rel, rel == 'sibling' and siblings
end

-- The common send, taken without the general loop's bookkeeping: one message to one member
-- named as such, no reply_to, no idempotency key. This path only ever accepts.
-- At the first check that does not pass it hands what it read to the general loop below,
-- which checks everything again from the start (reading nothing twice) and words the refusal.
local fast_st, fast_pa, fast_fields, fast_vals, fast_depth = nil, nil, nil, nil, nil
if count == 1 and not paused and ARGV[2] == 'one' and ARGV[8] == '' and ARGV[10] == '' then
  local sender, rcpt, subject, body, mtype, prio =
    ARGV[1], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7]
  if rcpt ~= 'parent' and rcpt ~= sender and #body <= max_body
    and (subject == '' or (#subject <= max_name and not find(subject, '[%c\194]')))
    and (mtype == 'message' or (#mtype <= 32 and find(mtype, '^[a-z_]+$')
      and mtype ~= 'outcome' and mtype ~= 'control'))
    and (prio == '0' or prio == '1' or prio == '2') then
    fast_st = call('HMGET', status, sender, rcpt)
    local ss, rs = fast_st[1], fast_st[2]
    local ok = open_routing
    if family and ss and rs then
      fast_pa = call('HMGET', parents, sender, rcpt)
      local _
      _, ok = reach(sender, fast_pa[1] or '', rcpt, fast_pa[2] or '')
    end
    if ok and ss and rs and ss ~= 'failed' and ss ~= 'cancelled'
      and rs ~= 'failed' and rs ~= 'cancelled' and rs ~= 'lost' then
      local sf, pf, bf = 's\n' .. sender, 'p\n' .. sender .. '\n' .. rcpt, 'b\n' .. rcpt
      local df = false
      if dampen_turns > 0 then
        if rcpt < sender then df = 'd\n' .. rcpt .. '\n' .. sender
        else df = 'd\n' .. sender .. '\n' .. rcpt end
        fast_fields = {sf, '#sent', pf, bf, df}
      else
        fast_fields = {sf, '#sent', pf, bf}
      end
      fast_vals = call('HMGET', rate, unpack(fast_fields))
      fast_depth = tonumber(call('HGET', inbox, rcpt) or '0')
      local sent = tonumber(fast_vals[2] or '0')
      local brk = fast_vals[4]
      local turns = df and dampened(fast_vals[5], rcpt) or 0
      if (max_msgs <= 0 or sent < max_msgs) and fast_depth < inbox_cap
        and not (brk and tonumber(match(brk, ' (%d+)$') or '0') > now)
        and turns <= dampen_turns then
        local p_ok, p_tokens = bucket(fast_vals[3], pair_burst, pair_rate)
        local s_ok, s_tokens = bucket(fast_vals[1], snd_burst, snd_rate)
        if p_ok and s_ok then
          -- accepted: append, then count (as the general loop and its flush would)
          local id = append(0, rcpt, 0, false)
          local kv, n = {'#sent', tostring(sent + 1)}, 2
          if p_tokens then kv[n + 1], kv[n + 2], n = pf, bucket_value(p_tokens), n + 2 end
          if s_tokens then kv[n + 1], kv[n + 2], n = sf, bucket_value(s_tokens), n + 2 end
          if df then
            kv[n + 1], kv[n + 2], n = df, (turns == 0 and '0' or turns) .. ' ' .. now_s
              .. ' ' .. sender, n + 2
          end
          call('HSET', rate, unpack(kv, 1, n))
          call('HSET', inbox, rcpt, (fast_depth + 1) .. '')
          if new_cfg then store_cfg() end
          return {1, id, rcpt}
        end
      end
    end
  end
end

-- What this call knows and will write. Sends change only the rate hash, the inbox depths,
-- the idempotency keys and the stream, so everything read here stays true for the call.
local cached, dirty = {}, {}        -- rate hash: field -> value|false; fields to write
local status_of, parent_of = {}, {} -- member -> status / parent name, false: none
local depth_of, depth_dirty = {}, {} -- inbox depth now (read, plus this call's); to write
local idem_of, idem_new = nil, nil  -- idempotency field -> "id\tto"|false; to write (lazy)
local sent_any = false
local whole = false -- every member's status and inbox depth read (by a broadcast)
if fast_st then -- what the fast path read before it stepped aside
  status_of[ARGV[1]], status_of[ARGV[3]] = fast_st[1] or false, fast_st[2] or false
  if fast_pa then
    parent_of[ARGV[1]], parent_of[ARGV[3]] = fast_pa[1] or false, fast_pa[2] or false
  elseif family then -- statuses known, parents not: let the general loop read both
    status_of[ARGV[1]], status_of[ARGV[3]] = nil, nil
  end
  if fast_vals then
    for i = 1, #fast_fields do cached[fast_fields[i]] = fast_vals[i] or false end
    depth_of[ARGV[3]] = fast_depth
  end
end

-- The status (and, with with_parents, the parent) of names not looked up yet. Open routing
-- needs no parents unless "parent" is named or a broadcast groups its receipts; membership is
-- read from the status hash (join writes both hashes, and nothing deletes from either).
local function members(names, with_parents)
  local need, n = nil, 0
  for i = 1, #names do
    local name = names[i]
    if status_of[name] == nil then
      if not need then need = {} end
      n = n + 1
      need[n] = name
      status_of[name] = false -- also marks it as being fetched (duplicates)
    end
  end
  if not need then return end
  local st = call('HMGET', status, unpack(need))
  for i = 1, n do status_of[need[i]] = st[i] or false end
  if not with_parents then return end
  local pa = call('HMGET', parents, unpack(need))
  for i = 1, n do parent_of[need[i]] = pa[i] or false end
end

-- Read rate fields into `cached`: by name, or (many fields of a hash Redis still keeps as a
-- list, where each name is a scan of it all) the whole hash at once.
local function rate_fields(fields, nf)
  if nf > 16 and call('HLEN', rate) <= 128 then
    local want = {}
    for i = 1, nf do want[fields[i]] = true; cached[fields[i]] = false end
    local flat = call('HGETALL', rate)
    for i = 1, #flat, 2 do
      if want[flat[i]] then cached[flat[i]] = flat[i + 1] end
    end
    return
  end
  local vals = call('HMGET', rate, unpack(fields, 1, nf))
  for i = 1, nf do cached[fields[i]] = vals[i] or false end
end

-- each message in order; a refusal ends that message's turn (break) with its reply
-- A batch reads up front, in one HMGET per hash, what its plain messages (one named
-- recipient each) will look at: the status (and parent) of every sender and recipient, the
-- rate fields and inbox depths of every pair. The loop below then finds them known.
if count > 1 then
  local names, nn, fields, nf, depths, nd = {}, 0, {'#sent'}, 1, {}, 0
  local named, counted, paired = {}, {}, {} -- names, recipients and pairs already listed
  for item = 1, count do
    local base = (item - 1) * NF
    local sender, mode, rcpt = ARGV[base + 1], ARGV[base + 2], ARGV[base + 3]
    if not named[sender] then
      named[sender] = true
      nn = nn + 1; names[nn] = sender
      nf = nf + 1; fields[nf] = 's\n' .. sender
    end
    if mode == 'one' and rcpt ~= 'parent' and rcpt ~= sender then
      if not named[rcpt] then
        named[rcpt] = true
        nn = nn + 1; names[nn] = rcpt
      end
      if not counted[rcpt] then
        counted[rcpt] = true
        nd = nd + 1; depths[nd] = rcpt
        nf = nf + 1; fields[nf] = 'b\n' .. rcpt
      end
      local pf = 'p\n' .. sender .. '\n' .. rcpt
      if not paired[pf] then
        paired[pf] = true
        nf = nf + 1; fields[nf] = pf
        if dampen_turns > 0 then
          nf = nf + 1
          if rcpt < sender then fields[nf] = 'd\n' .. rcpt .. '\n' .. sender
          else fields[nf] = 'd\n' .. sender .. '\n' .. rcpt end
        end
      end
    end
  end
  members(names, family)
  rate_fields(fields, nf)
  if nd > 0 then
    local vals = call('HMGET', inbox, unpack(depths, 1, nd))
    for i = 1, nd do depth_of[depths[i]] = tonumber(vals[i] or '0') end
  end
end

-- A batch's plain message (one member named, no reply_to, no idempotency key), with what it
-- needs read up front: checked and counted against the call's caches as the general code
-- below would, which it steps aside for (returning nil, having changed nothing) at the first
-- check that does not pass, so that code decides and words the refusal.
local plain_fields, plain_turns = {}, {} -- sender -> recipient -> its rate fields; "0 now sender"
local function plain(base)
  local sender, rcpt, subject, body, mtype, prio =
    ARGV[base + 1], ARGV[base + 3], ARGV[base + 4], ARGV[base + 5], ARGV[base + 6], ARGV[base + 7]
  if paused or ARGV[base + 2] ~= 'one' or ARGV[base + 8] ~= '' or ARGV[base + 10] ~= ''
    or rcpt == 'parent' or rcpt == sender or #body > max_body
    or (subject ~= '' and (#subject > max_name or find(subject, '[%c\194]')))
    or (mtype ~= 'message' and (#mtype > 32 or not find(mtype, '^[a-z_]+$')
      or mtype == 'outcome' or mtype == 'control'))
    or (prio ~= '0' and prio ~= '1' and prio ~= '2') then
    return nil
  end
  local ss, rs = status_of[sender], status_of[rcpt]
  if not ss or not rs or ss == 'failed' or ss == 'cancelled'
    or rs == 'failed' or rs == 'cancelled' or rs == 'lost' then
    return nil
  end
  if family then
    local sp, np = parent_of[sender], parent_of[rcpt]
    if sp == nil or np == nil then return nil end
    local _, ok = reach(sender, sp or '', rcpt, np or '')
    if not ok then return nil end
  end
  local to = plain_fields[sender]
  if not to then to = {}; plain_fields[sender] = to end
  local names = to[rcpt] -- a batch names the same pairs over and over: built once per call
  if not names then
    local df = false
    if dampen_turns > 0 then
      if rcpt < sender then df = 'd\n' .. rcpt .. '\n' .. sender
      else df = 'd\n' .. sender .. '\n' .. rcpt end
    end
    names = {'s\n' .. sender, 'p\n' .. sender .. '\n' .. rcpt, 'b\n' .. rcpt, df}
    to[rcpt] = names
  end
  local sf, pf, bf, df = names[1], names[2], names[3], names[4]
  local sv, pv, bv, sent, depth = cached[sf], cached[pf], cached[bf], cached['#sent'], depth_of[rcpt]
  local dv = df and cached[df]
  if sv == nil or pv == nil or bv == nil or sent == nil or depth == nil or dv == nil then
    return nil
  end
  sent = tonumber(sent or '0')
  local turns = df and dampened(dv, rcpt) or 0
  if (max_msgs > 0 and sent >= max_msgs) or depth >= inbox_cap or turns > dampen_turns
    or (bv and tonumber(match(bv, ' (%d+)$') or '0') > now) then
    return nil
  end
  local p_ok, p_tokens = bucket(pv, pair_burst, pair_rate)
  if not p_ok then return nil end
  local s_ok, s_tokens = bucket(sv, snd_burst, snd_rate)
  if not s_ok then return nil end
  -- accepted: append now, count (numbers and buckets are written as text at the end)
  local id = append(base, rcpt, 0, false)
  sent_any = true
  cached['#sent'], dirty['#sent'] = sent + 1, true
  if p_tokens then
    if type(pv) == 'table' then pv[1] = p_tokens else cached[pf] = {p_tokens} end
    dirty[pf] = true
  end
  if s_tokens then
    if type(sv) == 'table' then sv[1] = s_tokens else cached[sf] = {s_tokens} end
    dirty[sf] = true
  end
  if df then
    local v = turns == 0 and plain_turns[sender]
    if not v then
      v = (turns == 0 and '0' or turns) .. ' ' .. now_s .. ' ' .. sender
      if turns == 0 then plain_turns[sender] = v end
    end
    cached[df], dirty[df] = v, true
  end
  depth_of[rcpt], depth_dirty[rcpt] = depth + 1, true
  return {1, id, rcpt}
end

local out = count > 1 and {} or nil
local result
for item = 1, count do
  local base = (item - 1) * NF
  result = count > 1 and plain(base) or nil
  repeat
    if result then break end
    local sender, mode, rcpt_arg = ARGV[base + 1], ARGV[base + 2], ARGV[base + 3]
    local subject, body, mtype, prio = ARGV[base + 4], ARGV[base + 5], ARGV[base + 6], ARGV[base + 7]
    local reply_to, ikey = ARGV[base + 8], ARGV[base + 10]
    local one = mode == 'one'

    -- idempotent replay, before any other check: the same sender and key return the first
    -- send's id, whatever changed since (a pause, a spent budget, a closed recipient)
    local ifield = nil
    if ikey ~= '' then
      ifield = sender .. '\n' .. ikey
      if not idem_of then idem_of, idem_new = {}, {} end
      local prev = idem_of[ifield]
      if prev == nil then
        prev = call('HGET', idem, ifield) or false
        idem_of[ifield] = prev
      end
      if prev then
        local tab = find(prev, '\t', 1, true)
        local sent_to = {}
        for n in string.gmatch(string.sub(prev, tab + 1), '[^\n]+') do sent_to[#sent_to + 1] = n end
        result = {2, string.sub(prev, 1, tab - 1), sent_to}; break
      end
    end

    -- text rules: printable (no C0/C1 control characters), at most max_name characters
    if paused then result = refuse('channel_paused', 'channel is paused'); break end
    if #body > max_body then result = refuse('too_large', 'body is too large (bytes)', max_body, #body); break end
    if subject ~= '' then
      if #subject > max_name then -- never more characters than bytes: count only when needed
        local _, n = gsub(subject, '[^\128-\191]', '')
        if n > max_name then
          result = refuse('too_large', 'subject is too long (characters)', max_name, n); break
        end
      end
      if find(subject, '[%c\194]')
        and (find(subject, '%c') or find(subject, '\194[\128-\159]')) then
        result = refuse('invalid_input', 'subject has control characters'); break
      end
    end
    if mtype ~= 'message' then
      if #mtype > 32 or not find(mtype, '^[a-z_]+$') then
        result = refuse('invalid_input', 'bad message type'); break
      end
      if mtype == 'outcome' or mtype == 'control' then
        result = refuse('invalid_input', 'outcome and control messages are written by the bus only'); break
      end
    end
    if prio ~= '0' and prio ~= '1' and prio ~= '2' then
      result = refuse('invalid_input', 'priority must be 0, 1 or 2'); break
    end
    if max_msgs > 0 then
      local sent = cached['#sent']
      if sent == nil then
        sent = call('HGET', rate, '#sent') or false
        cached['#sent'] = sent
      end
      sent = tonumber(sent or '0')
      if sent >= max_msgs then
        result = refuse('budget', 'channel message budget spent', max_msgs, sent); break
      end
    end

    -- the sender's and the named recipients' status and parent, in one HMGET per hash (a
    -- broadcast reads the whole parents hash below instead)
    local names
    if one then
      names = {rcpt_arg}
      if rcpt_arg == 'parent' then
        if status_of[sender] == nil then members({sender}, true) end
        if parent_of[sender] == nil then -- looked up without parents by an earlier message
          parent_of[sender] = call('HGET', parents, sender) or false
        end
      elseif status_of[sender] == nil or status_of[rcpt_arg] == nil then
        members({sender, rcpt_arg}, family)
      end
    else
      names = {}
      local lookup, with_parents = {sender}, family
      if mode ~= 'all' then
        for name in string.gmatch(rcpt_arg, '[^\n]+') do
          names[#names + 1] = name
          if name ~= 'parent' then lookup[#lookup + 1] = name else with_parents = true end
        end
      end
      members(lookup, with_parents)
      if with_parents and parent_of[sender] == nil then
        parent_of[sender] = call('HGET', parents, sender) or false
      end
    end
    local sender_status = status_of[sender]
    if not sender_status then result = refuse('unknown_agent', 'sender is not a member'); break end
    if sender_status == 'failed' or sender_status == 'cancelled' then
      result = refuse('agent_closed', 'sender is ' .. sender_status); break
    end

    -- chain depth and the auto-reply rule
    local depth = 0
    if reply_to ~= '' then
      if not find(reply_to, '^%d+%-%d+$') then
        result = refuse('invalid_input', 'reply_to is not a message id'); break
      end
      local e = call('XRANGE', stream, reply_to, reply_to)
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
          and find('\n' .. deny_list .. '\n', '\n' .. psender .. '\n', 1, true) then
          result = refuse('loop', 'no automatic answer to ' .. psender .. ' (deny-listed sender)', 0, 1); break
        end
      else
        depth = 1 -- the original was trimmed; count this as a first reply
      end
      if depth > max_chain then
        result = refuse('chain_too_deep', 'reply chain too deep', max_chain, depth); break
      end
    end

    -- recipients, in order; duplicates dropped. A refusal of one recipient refuses a "one"
    -- send; otherwise it is listed (name, code, message, limit, current, retry_ms) in `refused`
    local sp = parent_of[sender] or ''
    local targets, nt, refused, nr = {}, 0, {}, 0
    if mode == 'all' then
      local flat = call('HGETALL', parents)
      for i = 1, #flat, 2 do parent_of[flat[i]] = flat[i + 1] end
      if not whole then
        -- every member's status and inbox depth, each hash read whole: up to 128 fields Redis
        -- keeps a hash as a list, where every field named in an HMGET is a scan of it all
        whole = true
        local st = call('HGETALL', status)
        for i = 1, #st, 2 do
          if status_of[st[i]] == nil then status_of[st[i]] = st[i + 1] end
        end
        local ib = call('HGETALL', inbox)
        for i = 1, #ib, 2 do
          if depth_of[ib[i]] == nil then depth_of[ib[i]] = tonumber(ib[i + 1]) end
        end
      end
      sp = parent_of[sender] or ''
      local groups = {parent = {}, sibling = {}, child = {}, member = {}}
      for i = 1, #flat, 2 do
        local name, np = flat[i], flat[i + 1]
        if name ~= sender then
          local rel, ok = reach(sender, sp, name, np)
          if ok then local g = groups[rel]; g[#g + 1] = name end
        end
      end
      for _, rel in ipairs({'parent', 'sibling', 'child', 'member'}) do
        local g = groups[rel]
        table.sort(g)
        for i = 1, #g do nt = nt + 1; targets[nt] = g[i] end
      end
    else
      local seen = {}
      for i = 1, #names do
        local name = names[i]
        local resolved, code, msg = name, nil, nil
        if name == 'parent' then
          if sp == '' then
            resolved, code, msg = nil, 'unknown_agent', 'a root agent has no parent'
          else
            resolved = sp
          end
        elseif not status_of[name] then
          resolved = call('HGET', ids, name)
          if not resolved then code, msg = 'unknown_agent', 'no such agent: ' .. name end
        end
        if resolved and not seen[resolved] then
          seen[resolved] = true
          if resolved == sender then
            name, code, msg = resolved, 'invalid_input', 'an agent cannot send to itself'
          else
            nt = nt + 1
            targets[nt] = resolved
          end
        end
        if code then
          if one then result = refuse(code, msg); break end
          refused[nr + 1], refused[nr + 2], refused[nr + 3] = name, code, msg
          refused[nr + 4], refused[nr + 5], refused[nr + 6] = '', '', ''
          nr = nr + 6
        end
      end
    end
    if result then break end

    -- the checks per recipient; what an accepted send will write collects in `writes`
    -- (field, value, ...), applied only once every check has passed
    local accepted, na, writes, nw = {}, 0, {}, 0
    if nt > 0 then
      -- status and parent of targets not read above (a broadcast's, an id's, "parent"'s)
      -- and the rate fields and inbox depths not read before, one HMGET each
      members(targets, family and mode ~= 'all') -- a broadcast has every parent from HGETALL
      local dampen = dampen_turns > 0 and mode ~= 'all'
      local pre = 'p\n' .. sender .. '\n'
      local sfield = 's\n' .. sender
      local fields, nf = {}, 0
      if cached[sfield] == nil then nf = nf + 1; fields[nf] = sfield end
      if cached['#sent'] == nil then nf = nf + 1; fields[nf] = '#sent' end
      local keyed = {} -- per target: pair field, breaker field, dampener field
      local need_depth, nd = nil, 0
      for i = 1, nt do
        local name = targets[i]
        local pf, bf = pre .. name, 'b\n' .. name
        local df = false
        if dampen then
          if name < sender then df = 'd\n' .. name .. '\n' .. sender
          else df = 'd\n' .. sender .. '\n' .. name end
        end
        local j = 3 * i
        keyed[j - 2], keyed[j - 1], keyed[j] = pf, bf, df
        if cached[pf] == nil then nf = nf + 1; fields[nf] = pf; cached[pf] = false end
        if cached[bf] == nil then nf = nf + 1; fields[nf] = bf; cached[bf] = false end
        if df and cached[df] == nil then nf = nf + 1; fields[nf] = df; cached[df] = false end
        if depth_of[name] == nil and whole then
          depth_of[name] = 0 -- the whole hash was read: no field, no messages
        elseif depth_of[name] == nil then
          if not need_depth then need_depth = {} end
          nd = nd + 1
          need_depth[nd] = name
          depth_of[name] = 0
        end
      end
      if nf > 0 then rate_fields(fields, nf) end
      if nd > 0 then
        local vals = call('HMGET', inbox, unpack(need_depth, 1, nd))
        for i = 1, nd do depth_of[need_depth[i]] = tonumber(vals[i] or '0') end
      end
      for i = 1, nt do
        local name = targets[i]
        local j = 3 * i
        local pf, bf, df = keyed[j - 2], keyed[j - 1], keyed[j]
        local rel, ok = 'member', true -- open routing reaches everyone (and names no relation)
        if family then rel, ok = reach(sender, sp, name, parent_of[name] or '') end
        local s = status_of[name]
        local queued = depth_of[name]
        local code, msg, limit, current, retry = nil, nil, nil, nil, nil
        -- circuit breaker (written by claim.lua / sweep.lua): "failures first until_ms"
        local brk = cached[bf]
        local brk_ms = brk and (tonumber(match(brk, ' (%d+)$') or '0') - now) or 0
        -- ping-pong dampener: "turns at_ms last_sender" per unordered pair
        local turns = df and dampened(cached[df], name) or 0
        local tokens = nil
        if not ok then
          code, msg = 'routing_refused', name .. ' is outside ' .. sender .. "'s reach (" .. rel .. ')'
        elseif s == 'failed' or s == 'cancelled' or s == 'lost' then
          code, msg = 'recipient_closed', name .. ' is ' .. s
        elseif queued >= inbox_cap then
          code, msg, limit, current = 'inbox_full', name .. "'s inbox is full", inbox_cap, queued
        elseif brk_ms > 0 then
          code, msg, limit, current, retry = 'circuit_open',
            name .. ' keeps failing: deliveries paused', 0, 0, brk_ms
        elseif turns > dampen_turns then
          code, msg, limit, current, retry = 'loop', 'ping-pong between ' .. sender .. ' and '
            .. name .. ' dampened', dampen_turns, turns, dampen_window
        else
          local pass, left, wait_ms = bucket(cached[pf], pair_burst, pair_rate)
          if not pass then
            code, msg, limit, current, retry = 'rate_limited',
              'rate limit ' .. sender .. ' -> ' .. name, pair_burst, left, wait_ms
          else
            tokens = left
          end
        end
        if code then
          if one then result = refuse(code, msg, limit, current, retry); break end
          refused[nr + 1], refused[nr + 2], refused[nr + 3] = name, code, msg
          refused[nr + 4], refused[nr + 5] = tostring(limit or ''), tostring(current or '')
          refused[nr + 6] = tostring(retry or '')
          nr = nr + 6
        else
          na = na + 1
          accepted[na] = name
          if tokens then
            writes[nw + 1], writes[nw + 2] = pf, bucket_value(tokens)
            nw = nw + 2
          end
          if df then
            writes[nw + 1], writes[nw + 2] = df, (turns == 0 and '0' or turns) .. ' ' .. now_s
              .. ' ' .. sender
            nw = nw + 2
          end
        end
      end
    end
    if result then break end

    if na == 0 then
      if one then result = refuse('invalid_input', 'no recipient'); break end
      result = {1, false, accepted, refused}; break
    end

    local sfield = 's\n' .. sender
    local s_ok, s_tokens, s_retry = bucket(cached[sfield], snd_burst, snd_rate)
    if not s_ok then
      result = refuse('rate_limited', 'sender rate limit for ' .. sender, snd_burst, s_tokens, s_retry); break
    end

    -- every check passed: append now, count (written at the end of the call)
    for i = 1, nw, 2 do
      local field = writes[i]
      cached[field] = writes[i + 1]
      dirty[field] = true
    end
    cached['#sent'] = tostring((tonumber(cached['#sent'] or '0') or 0) + 1)
    dirty['#sent'] = true
    if s_tokens then
      cached[sfield] = bucket_value(s_tokens)
      dirty[sfield] = true
    end
    for i = 1, na do
      local name = accepted[i]
      depth_of[name] = depth_of[name] + 1
      depth_dirty[name] = true
    end
    local to = na == 1 and accepted[1] or table.concat(accepted, '\n', 1, na)
    local id = append(base, to, depth, mode == 'all')
    sent_any = true
    if ifield then
      local v = id .. '\t' .. to
      idem_of[ifield] = v
      idem_new[#idem_new + 1] = ifield
      idem_new[#idem_new + 1] = v
    end
    if one then result = {1, id, to} else result = {1, id, accepted, refused} end
  until true
  if out then out[item] = result end
end

-- the counters of every appended message, one write per hash: the inbox depths as absolute
-- values (read above, nothing else changes them during the script), as strings (Redis turns
-- a Lua number into a command argument with a slow printf)
if sent_any then
  local kv, n = {}, 0
  for field in pairs(dirty) do
    local v = cached[field]
    if type(v) == 'table' then v = bucket_value(v[1]) elseif type(v) == 'number' then v = str(v) end
    kv[n + 1], kv[n + 2], n = field, v, n + 2
  end
  call('HSET', rate, unpack(kv, 1, n))
  kv, n = {}, 0
  for name in pairs(depth_dirty) do kv[n + 1], kv[n + 2], n = name, str(depth_of[name]), n + 2 end
  call('HSET', inbox, unpack(kv, 1, n))
  if idem_new and #idem_new > 0 then call('HSET', idem, unpack(idem_new)) end
  if new_cfg then store_cfg() end
end
return out or result
