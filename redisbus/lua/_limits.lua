-- _limits.lua: the helpers of send.lua's limits: the token buckets, breakers and dampeners of
-- the channel's rate hash, the text rules and the routing rule. Not a script: see
-- _prelude.lua (one paragraph per helper, each after the helpers it calls; a helper touches
-- only the keys its caller passes in). A helper sees only its arguments and its own memo (the
-- locals of its paragraph: made anew on every call of a script run on its own, kept from call
-- to call in a Functions library, so a memo holds only what its key determines): the script
-- passes it the clock, the channel's limits and the tables it keeps.

-- The channel's limits and pause switch from the copy send.lua packs in the rate hash's
-- '#lim' field (`cfg`), as a list: 1 routing, 2 siblings ('1' or ''), 3 inbox_cap,
-- 4 max_body_bytes, 5 max_name_chars, 6 pair_rate_burst, 7 pair_rate_per_s,
-- 8 sender_rate_burst, 9 sender_rate_per_s, 10 max_chain_depth, 11 max_messages,
-- 12 dampen_turns, 13 dampen_window (ms), 14 auto_reply_deny, 15 paused (1 or 0),
-- 16 max_chain_messages. JSON text on Redis (one C call, numbers already numbers); the
-- in-memory test double (fakeredis, whose cjson is not Redis') keeps it tab-separated.
-- The list is read only: a Functions library keeps it from call to call, one per text (a
-- fleet's channels mostly share theirs; up to 64, then it starts again), so most sends
-- parse no JSON at all.
local limits_memo, limits_kept = {}, 0
local function limits_of(cfg)
  local l = limits_memo[cfg]
  if l then return l end
  if cmsgpack then
    l = cjson.decode(cfg)
  else
    l = {string.match(cfg, '^' .. string.rep('([^\t]*)\t', 15) .. '(.*)$')}
    for i = 3, 13 do l[i] = tonumber(l[i]) end
    l[15], l[16] = tonumber(l[15]), tonumber(l[16])
  end
  if limits_kept == 64 then limits_memo, limits_kept = {}, 0 end
  limits_memo[cfg], limits_kept = l, limits_kept + 1
  return l
end

-- The text limits_of reads, packed from the channel's settings (hash `meta`); nil when it
-- has none (no such channel). send.lua keeps it in the rate hash's '#lim' field, so a send
-- reads it with the rate fields it reads anyway instead of fifteen fields of meta. Numbers
-- are written with 17 digits, so each reads back as the very number meta held.
local function limits_text(meta)
  local f = redis.call('HMGET', meta, 'routing', 'siblings', 'inbox_cap', 'max_body_bytes',
    'max_name_chars', 'pair_rate_burst', 'pair_rate_per_s', 'sender_rate_burst',
    'sender_rate_per_s', 'max_chain_depth', 'max_messages', 'dampen_turns', 'dampen_window_s',
    'auto_reply_deny', 'paused', 'max_chain_messages')
  if not f[1] then return nil end
  local v = {f[1], f[2] or '', tonumber(f[3]), tonumber(f[4]), tonumber(f[5]),
    tonumber(f[6]), tonumber(f[7]), tonumber(f[8]), tonumber(f[9]), tonumber(f[10]),
    tonumber(f[11]), tonumber(f[12]) or 0, (tonumber(f[13]) or 0) * 1000, f[14] or '',
    f[15] == '1' and 1 or 0, tonumber(f[16]) or 0}
  for i = 1, 16 do
    local x = v[i]
    if not cmsgpack then v[i] = x == nil and '' or tostring(x)
    elseif type(x) == 'number' then v[i] = string.format('%.17g', x)
    elseif x == nil then v[i] = 'null'
    else v[i] = cjson.encode(x) end
  end
  return cmsgpack and '[' .. table.concat(v, ',') .. ']' or table.concat(v, '\t')
end

-- "tokens now_ms": the value of a bucket left with `tokens` at `now_s` (the call's clock, as
-- text). Lua writes a number out with a printf of a float (about 4,000 instructions), and the
-- counts recur: a bucket refilled to its burst is left with burst - 1, and a broadcast's
-- recipients' equal buckets with one count. So each count's text is made once and kept (a
-- Functions library keeps this memo from call to call: up to 64 counts, then it starts
-- again), and a value is that text and the clock's joined.
local token_texts, token_texts_kept = {}, 0
local function bucket_value(tokens, now_s)
  local t = token_texts[tokens]
  if not t then
    if token_texts_kept == 64 then token_texts, token_texts_kept = {}, 0 end
    t = tokens .. ''
    token_texts[tokens], token_texts_kept = t, token_texts_kept + 1
  end
  return t .. ' ' .. now_s
end

-- token bucket "tokens last_ms" at `now` (ms), with `burst` tokens refilled at `per_s`:
-- returns ok, tokens_after, retry_ms (nothing written). The last value parsed is kept: a
-- broadcast's pair buckets, written in one call, hold one value. A bucket this call spent
-- twice is a table {tokens} (its time is now), turned into text once, when the call writes
-- its counters.
local seen_v, seen_tk, seen_last = nil, 0, 0
local function bucket(v, burst, per_s, now)
  if burst <= 0 or per_s <= 0 then return true, nil, 0 end
  local tokens = burst
  if type(v) == 'table' then
    tokens = math.min(burst, v[1])
  elseif v then
    if v ~= seen_v then
      local tk, last = string.match(v, '^(%S+) (%S+)$')
      seen_v, seen_tk, seen_last = v, tonumber(tk), tonumber(last)
    end
    tokens = math.min(burst, seen_tk + (now > seen_last and now - seen_last or 0) * per_s / 1000)
  end
  if tokens < 1 then
    return false, tokens, math.ceil((1 - tokens) * 1000 / per_s)
  end
  return true, tokens - 1, 0
end

-- A bucket `field` spent by an accepted message, left with `tokens` at `now_s`, in the call's
-- copy of the rate hash (`cached`: field -> value; `dirty`: the fields to write). The first
-- spend of a field in a call stores its text (shared by a broadcast's equal buckets); a field
-- spent again (a batch to the same pair) becomes a table whose count later spends change in
-- place, turned into text once at the end.
local function spend(cached, dirty, field, tokens, now_s)
  if dirty[field] then
    local v = cached[field]
    if type(v) == 'table' then v[1] = tokens else cached[field] = {tokens} end
  else
    cached[field], dirty[field] = bucket_value(tokens, now_s), true
  end
end

-- Read fields `fields[1..nf]` of the rate hash `rate` into `cached` (false: none): by name,
-- or (many fields of a hash Redis still keeps as a list, where each name is a scan of it all)
-- the whole hash at once.
local function rate_fields(rate, cached, fields, nf)
  if nf > 16 and redis.call('HLEN', rate) <= 128 then
    local want = {}
    for i = 1, nf do want[fields[i]] = true; cached[fields[i]] = false end
    local flat = redis.call('HGETALL', rate)
    for i = 1, #flat, 2 do
      if want[flat[i]] then cached[flat[i]] = flat[i + 1] end
    end
    return
  end
  local vals = redis.call('HMGET', rate, unpack(fields, 1, nf))
  for i = 1, nf do cached[fields[i]] = vals[i] or false end
end

-- The rate fields of a pair: the sender's pair bucket, the recipient's breaker and (when the
-- dampener is on and `dampen` asks for it) the pair's dampener, which one unordered pair
-- shares. Made anew each time: three concatenations cost less than a memo's tables.
local function pair_fields(sender, name, dampen)
  local pf, bf = 'p\n' .. sender .. '\n' .. name, 'b\n' .. name
  if not dampen then return pf, bf, false end
  if name < sender then return pf, bf, 'd\n' .. name .. '\n' .. sender end
  return pf, bf, 'd\n' .. sender .. '\n' .. name
end

-- ping-pong dampener "turns at_ms last_sender" of a pair (`v`, or false), as seen at `now`
-- with a `window` (ms): the turns a send to `name` would make. The last value parsed is kept:
-- a batch's messages to one pair see the one value the first of them wrote.
local damp_v, damp_n, damp_at, damp_last = nil, 0, nil, nil
local function dampened(v, name, now, window)
  if not v then return 0 end
  if v ~= damp_v then
    local n, at, last = string.match(v, '^(%d+) (%d+) (.*)$')
    damp_v, damp_n, damp_at, damp_last = v, tonumber(n), tonumber(at), last
  end
  if not damp_at or now - damp_at > window then return 0 end
  if damp_last == name then return damp_n + 1 end
  return damp_n
end

-- may the sender (whose parent is sp) reach `name` (whose parent is `np`), under open routing
-- (`open`) or family routing (with or without `siblings`)? relation, allowed
local function reach(sender, sp, name, np, open, siblings)
  local rel = 'member'
  if np == sender then rel = 'child'
  elseif name == sp and sp ~= '' then rel = 'parent'
  elseif np == sp then rel = 'sibling' end
  if open or rel == 'child' or rel == 'parent' then return rel, true end
  return rel, rel == 'sibling' and siblings
end

-- send.lua's check, before its first write, that it was given the doorbell (`bells`, from
-- doorbells) of every agent its messages may go to: `args` its ARGV, `count` messages of `nf`
-- fields each (1 sender, 2 mode, 3 recipients). May go to: each name given as the send
-- resolves it (a member's name, known in `status_of`; "parent", the sender's parent, kept in
-- `parent_of`; an agent id, through hash `ids`), for a broadcast every member the sender
-- reaches under the channel's routing (`open`, `siblings`: see reach). The checks that follow
-- may refuse some: a superset. A broadcast's members are read whole, once for the call: hash
-- `parents` (every member, join writes it) into `parent_of`, hash `status` into `status_of`. A
-- broadcast whose recipients field is "known" (a retried one: see send.lua's header) may go to
-- the members whose doorbells it was given only: the others are not asked for. Returns
-- undeclared's reply (nil when none is missing), and the flat HGETALL of `parents` when it was
-- read.
local function may_ring(bells, args, count, nf, status, parents, ids, status_of, parent_of,
  open, siblings)
  local may, nm, roster = {}, 0, nil
  for item = 1, count do
    local base = (item - 1) * nf
    local sender = args[base + 1]
    if args[base + 2] == 'all' then
      if not roster then
        roster = redis.call('HGETALL', parents)
        for i = 1, #roster, 2 do parent_of[roster[i]] = roster[i + 1] end
        local st = redis.call('HGETALL', status)
        for i = 1, #st, 2 do
          if status_of[st[i]] == nil then status_of[st[i]] = st[i + 1] end
        end
      end
      if args[base + 3] ~= 'known' then
        local sp = parent_of[sender] or ''
        for i = 1, #roster, 2 do
          local name = roster[i]
          local _, ok = reach(sender, sp, name, roster[i + 1], open, siblings)
          if ok and name ~= sender then nm = nm + 1; may[nm] = name end
        end
      end
    else
      for name in string.gmatch(args[base + 3], '[^\n]+') do
        nm = nm + 1
        if name == 'parent' then
          if parent_of[sender] == nil then
            parent_of[sender] = redis.call('HGET', parents, sender) or false
          end
          may[nm] = parent_of[sender] ~= '' and parent_of[sender] -- a root's is ''
        elseif status_of[name] then
          may[nm] = name
        else
          may[nm] = redis.call('HGET', ids, name) or false
        end
      end
    end
  end
  return undeclared(bells, may, nm), roster
end

-- The channel's message budget: `sent` messages so far (text or number, nil for none) under
-- `max_msgs` (0: no budget). Returns nothing when one more may go, else code, message, limit,
-- current.
local function check_budget(sent, max_msgs)
  if max_msgs <= 0 then return end
  sent = tonumber(sent or '0')
  if sent >= max_msgs then return 'budget', 'channel message budget spent', max_msgs, sent end
end

-- The sender's own status (`st`, false when it is no member): may it send? Returns nothing
-- when it may, else code, message.
local function check_sender(st)
  if not st then return 'unknown_agent', 'sender is not a member' end
  if st == 'failed' or st == 'cancelled' then return 'agent_closed', 'sender is ' .. st end
end

-- One resolved recipient `name` of `sender` (whose parent is `sp`), under the limits `L`
-- (limits_of) at `now`: routing (family routing only; `np` its parent), closed (`st` its
-- status), inbox cap (`queued` its inbox depth), breaker (`brk`: "failures first until_ms",
-- written by claim.lua / sweep.lua, or false), dampener (`dv`: the pair's "turns at_ms
-- last_sender" or false; nil when not checked), pair bucket (`pv`, or false for a fresh one;
-- nil for none: a broadcast is the sender's budget, it has no bucket per pair). Returns
-- nothing but the tokens left in the pair bucket and the pair's turns when it passes, else
-- code, message, limit, current, retry_ms.
local function check_recipient(sender, sp, name, np, st, queued, brk, dv, pv, now, L)
  if L[1] ~= 'open' then
    local rel, ok = reach(sender, sp, name, np, false, L[2] == '1')
    if not ok then
      return 'routing_refused', name .. ' is outside ' .. sender .. "'s reach (" .. rel .. ')'
    end
  end
  if st == 'failed' or st == 'cancelled' or st == 'lost' then
    return 'recipient_closed', name .. ' is ' .. st
  end
  if queued >= L[3] then
    return 'inbox_full', name .. "'s inbox is full", L[3], queued
  end
  if brk then
    local brk_ms = (tonumber(string.match(brk, ' (%d+)$') or '0') - now)
    if brk_ms > 0 then
      return 'circuit_open', name .. ' keeps failing: deliveries paused', 0, 0, brk_ms
    end
  end
  local turns = 0
  if dv ~= nil then turns = dampened(dv, name, now, L[13]) end
  if turns > L[12] then
    return 'loop', 'ping-pong between ' .. sender .. ' and ' .. name .. ' dampened',
      L[12], turns, L[13]
  end
  local left = nil
  if pv ~= nil then
    local pass, wait_ms
    pass, left, wait_ms = bucket(pv, L[6], L[7], now)
    if not pass then
      return 'rate_limited', 'rate limit ' .. sender .. ' -> ' .. name, L[6], left, wait_ms
    end
  end
  return nil, nil, nil, nil, nil, left, turns
end

-- The text rules of a message: the channel is open (not `paused`), the body is at most
-- `max_body` bytes, the subject at most `max_name` characters and printable (no C0/C1 control
-- characters), the type one a caller may send, the priority one that exists. Returns nothing
-- when the message may go on, else code, message, limit, current.
local function check_text(subject, body, mtype, prio, paused, max_body, max_name)
  if paused then return 'channel_paused', 'channel is paused' end
  if #body > max_body then return 'too_large', 'body is too large (bytes)', max_body, #body end
  if subject ~= '' then
    if #subject > max_name then -- never more characters than bytes: count only when needed
      local _, n = string.gsub(subject, '[^\128-\191]', '')
      if n > max_name then return 'too_large', 'subject is too long (characters)', max_name, n end
    end
    if string.find(subject, '[%c\194]')
      and (string.find(subject, '%c') or string.find(subject, '\194[\128-\159]')) then
      return 'invalid_input', 'subject has control characters'
    end
  end
  if mtype ~= 'message' then
    if #mtype > 32 or not string.find(mtype, '^[a-z_]+$') then
      return 'invalid_input', 'bad message type'
    end
    if mtype == 'outcome' or mtype == 'control' then
      return 'invalid_input', 'outcome and control messages are written by the bus only'
    end
  end
  if prio ~= '0' and prio ~= '1' and prio ~= '2' then
    return 'invalid_input', 'priority must be 0, 1 or 2'
  end
end
