-- send.lua: check every limit and append messages to a channel stream, atomically.
--
-- KEYS[1] stream   KEYS[2] meta    KEYS[3] parents   KEYS[4] status
-- KEYS[5] ids      KEYS[6] inbox   KEYS[7] rate      KEYS[8] idem
-- KEYS[9] limits: the string where older versions cached meta's limits (the cache is the
--         rate hash's '#lim' field now); deleted when the cache is refilled
-- KEYS[10..] bells: doorbells, in pairs: an agent's bell, then its wakeup list (see ring);
--         those of every agent the messages may go to must be there
-- ARGV[1..] messages: one or several, 14 fields each (ARGV[14 * (i - 1) + k] for message i):
-- k=1  sender name
-- k=2  mode: "one" (a single recipient: any refusal refuses the send),
--            "many" (a list: refusals are per recipient), "all" (broadcast to the reachable)
-- k=3  recipients, "\n"-separated: names, agent ids or "parent"; for "all", "" (every member
--      the sender reaches) or "known" (every such member whose doorbell is in KEYS: a
--      broadcast made again after a {-1, ...} reply, so that members who joined since its
--      first try, which it is not given, do not make it ask again: they joined after it)
-- k=4  subject   k=5 body   k=6 type   k=7 priority (0, 1, 2)
-- k=8  reply_to entry id or ""   k=9 ttl (seconds) or ""
-- k=10 idempotency key or ""  k=11 trace context or ""
-- k=12 signature "kid:hex" or "" k=13 signed_at (ms) or ""
-- k=14 cause: the entry id of the message the sender is handling, or "" (see chain_of)
--
-- returns, for one message:
--         {0, code, message, limit, current, retry_after_ms}      the whole send is refused
--      or id                 a "one" send, accepted, to the recipient as named (cheapest)
--      or {1, id, name}      a "one" send, accepted, to `name` (an agent id or "parent" named)
--      or {1, id|false, {accepted...}, {name, code, message, limit, current, retry_ms, ...}}
--         and, when some were refused, {name...}: every recipient in receipt order (a list's
--         as given, a broadcast's as reached: parent, siblings, children, others)
--      or {2, id, {recipients...}}                                  idempotent replay
--   for several: a list of those, one per message, in order.
--   Or, for the whole call, {-1, name, ...}: agents the messages may go to whose doorbells
--   were not in KEYS (a broadcast's: every member's); nothing was written (call again with
--   them, and a broadcast's recipients "known": a member joining while it is made again then
--   does not make it ask once more, however fast members join).
--
-- The helpers of its limits (buckets, dampener, routing, text rules) and of its chain rules
-- are in the libraries _limits.lua and _chain.lua, loaded in front of it (redisbus/_scripts.py).
--
-- Every message is decided by the same checks, in the same order: those of the message
-- (replay, check_text, the budget, check_sender, chain_of), then those of each recipient
-- (resolve, check_recipient), then the sender's bucket. A broadcast has no bucket per pair: it
-- spends the sender's bucket only (so the rate state of a fleet that broadcasts grows with its
-- senders, not with its pairs), and the dampener does not count it. send_message() runs them
-- for every mode, however many messages share the call; a single send to one member named as
-- such takes a straight path of its own (the first block below) that calls the same helpers,
-- which the bench showed pays (about 40% of the script's server time); so does a batch's
-- message of that kind (plain(), below the routine: about 14% of a batched message's server
-- time). Messages are checked and appended in order, each seeing what the ones before it did
-- (inbox depths, token buckets, the budget, idempotency keys), exactly as separate sends
-- would; they share one read of the channel's limits, one clock reading and the member lookups. Nothing is written for a refused message: every check runs before its
-- writes. Each accepted message is appended at once (a later one may reply to it); the
-- counters of all of them (rate hash, inbox depths, idempotency keys) are gathered and
-- written once at the end.
--
-- Written for the hot path, where the Lua itself costs more than the Redis commands it calls:
-- library functions are locals; before the first message, one HMGET per hash reads what every
-- message of the call names (the channel's limits with the rate fields, then statuses,
-- parents, inbox depths), and the routine finds the rest known (a plain send, on its own
-- path, reads the same three hashes once: TIME, three HMGETs, XADD and two HSETs); field names and numbers turned into text
-- are made once per call; the limits come from one JSON field (one C call, numbers already
-- numbers); the common cases skip the pattern matching they cannot fail.

local call, tonumber, tostring, find, match = redis.call, tonumber, tostring, string.find,
  string.match
local floor, unpack, type = math.floor, unpack, type

local stream, meta, parents, status, ids, inbox, rate, idem, lim =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local bells = doorbells(stream, KEYS, 10)
local NF = 14
local count = #ARGV / NF
if count < 1 or count ~= floor(count) then
  return redis.error_reply('ERR send.lua takes 14 arguments per message')
end

local function first_of(list, n) -- list[1..n], as a list of its own (a scratch list is longer)
  local out = {}
  for i = 1, n do out[i] = list[i] end
  return out
end

local function refuse(code, msg, limit, current, retry_ms)
  return {0, code, msg, tostring(limit or ""), tostring(current or ""), tostring(retry_ms or "")}
end

-- Append the message at ARGV offset `base` to the stream, addressed to `to` (names joined by
-- "\n"), at `depth` in `chain` (see chain_of): the entry's one-letter fields, the optional
-- ones only when set; the recipients' doorbells rung. Returns the entry id.
local function append(base, to, depth, chain, broadcast)
  local subject, mtype, prio = ARGV[base + 4], ARGV[base + 6], ARGV[base + 7]
  local reply_to, ttl, ikey = ARGV[base + 8], ARGV[base + 9], ARGV[base + 10]
  local trace, sig, sig_ts = ARGV[base + 11], ARGV[base + 12], ARGV[base + 13]
  local cause = ARGV[base + 14]
  local f, n = {'f', ARGV[base + 1], 't', to, 'b', ARGV[base + 5]}, 6
  if subject ~= '' then f[n + 1], f[n + 2], n = 's', subject, n + 2 end
  if mtype ~= 'message' then f[n + 1], f[n + 2], n = 'k', mtype, n + 2 end
  if prio ~= '0' then f[n + 1], f[n + 2], n = 'p', prio, n + 2 end
  if reply_to ~= '' then f[n + 1], f[n + 2], n = 'r', reply_to, n + 2 end
  if depth > 0 then
    f[n + 1], f[n + 2], f[n + 3], f[n + 4], n = 'd', tostring(depth), 'h', chain, n + 4
  end
  if ttl ~= '' then f[n + 1], f[n + 2], n = 'x', ttl, n + 2 end
  if ikey ~= '' then f[n + 1], f[n + 2], n = 'i', ikey, n + 2 end
  if trace ~= '' then f[n + 1], f[n + 2], n = 'c', trace, n + 2 end
  if sig ~= '' then f[n + 1], f[n + 2], n = 'g', sig, n + 2 end
  if sig_ts ~= '' then f[n + 1], f[n + 2], n = 'n', sig_ts, n + 2 end
  -- the message being handled when this one was sent: signed, so its chain cannot be forged
  if cause ~= '' then f[n + 1], f[n + 2], n = 'u', cause, n + 2 end
  if broadcast then f[n + 1], f[n + 2], n = 'a', '1', n + 2 end
  local id = call('XADD', stream, '*', unpack(f, 1, n))
  ring(bells, to, id)
  return id
end

-- The commonest send, one message to one member named as such, with no idempotency key
-- (replies and messages sent while handling one included), goes straight through: the same
-- check helpers as send_message() below, in the same order, on what it reads itself (one
-- command per hash: the rate fields with the limits, the two statuses, the two parents under
-- family routing, the inbox depth), without the general path's closures, lists and field
-- bookkeeping. Its refusals are send_message()'s. What it does not decide itself, the limits
-- not cached yet or a recipient that is no member's name (an agent id, or unknown), it leaves
-- to the general path, which starts over (nothing is written before that).
if count == 1 and ARGV[2] == 'one' and ARGV[10] == '' and ARGV[3] ~= 'parent'
  and ARGV[3] ~= ARGV[1] then
  local sender, name = ARGV[1], ARGV[3]
  local sf = 's\n' .. sender
  local pf, bf, df = pair_fields(sender, name, true)
  local v = call('HMGET', rate, '#lim', '#sent', sf, pf, bf, df)
  if v[1] then
    local L = limits_of(v[1])
    local code, msg, limit, current, retry = check_text(ARGV[4], ARGV[5], ARGV[6], ARGV[7],
      L[15] == 1, L[4], L[5])
    if code then return refuse(code, msg, limit, current) end
    local sent = tonumber(v[2] or '0')
    code, msg, limit, current = check_budget(sent, L[11])
    if code then return refuse(code, msg, limit, current) end
    local family = L[1] ~= 'open'
    local st = call('HMGET', status, sender, name)
    local pa = family and call('HMGET', parents, sender, name)
    code, msg = check_sender(st[1])
    if code then return refuse(code, msg) end
    local chained, depth, chain = nil, 0, ''
    if ARGV[8] ~= '' or ARGV[14] ~= '' then -- a reply, or sent while handling a message
      chained = {}
      depth, chain, code, msg, limit, current = chain_of(stream, rate, chained, ARGV[8],
        ARGV[14], ARGV[6], L[14], L[10], L[16])
      if code then return refuse(code, msg, limit, current) end
    end
    if st[2] then
      local queued = as_count(call('HMGET', inbox, name)[1])
      local now, now_s = clock()
      local sp, np, dv = '', '', nil
      if pa then sp, np = pa[1] or '', pa[2] or '' end
      if L[12] > 0 then dv = v[6] or false end
      local tokens, turns
      code, msg, limit, current, retry, tokens, turns =
        check_recipient(sender, sp, name, np, st[2], queued, v[5] or false, dv, v[4] or false,
          now, L)
      if code then return refuse(code, msg, limit, current, retry) end
      local s_ok, s_tokens, s_retry = bucket(v[3] or false, L[8], L[9], now)
      if not s_ok then
        return refuse('rate_limited', 'sender rate limit for ' .. sender, L[8], s_tokens, s_retry)
      end
      -- every check passed: append, then count (what the general path's last step writes)
      if not bells[name] then return {-1, name} end
      local id = append(0, name, depth, chain, false)
      local kv, n = {'#sent', ((sent or 0) + 1) .. ''}, 2
      if tokens then kv[n + 1], kv[n + 2], n = pf, bucket_value(tokens, now_s), n + 2 end
      if dv ~= nil then
        kv[n + 1], kv[n + 2], n = df, (turns > 0 and turns or '0') .. ' ' .. now_s .. ' '
          .. sender, n + 2
      end
      if depth > 0 and L[16] > 0 then
        local cf = 'c\n' .. chain
        kv[n + 1], kv[n + 2], n = cf, (tonumber(chained[cf] or '1') + 1) .. '', n + 2
      end
      if s_tokens then kv[n + 1], kv[n + 2], n = sf, bucket_value(s_tokens, now_s), n + 2 end
      call('HSET', rate, unpack(kv, 1, n))
      call('HSET', inbox, name, (queued + 1) .. '')
      return id
    end
  end
end

-- The call's copy of the rate hash: field -> value|false (none), and the fields to write.
local cached, dirty = {}, {}

-- Before the first message: what the call's messages name. Read here, in one command: the
-- limits ('#lim'), the budget ('#sent'), and each sender's bucket, each pair's bucket and
-- dampener and each named recipient's breaker; the members and inbox depths they name are
-- read once the limits are known (below). send_message() reads whatever is still unknown
-- (agent ids, "parent", a broadcast's members) when it gets there.
local pre_names, pre_nn, pre_depths, pre_nd, pre_parents = {}, 0, {}, 0, false
do
  local names, nn, fields, nf, depths, nd = pre_names, 0, {'#lim', '#sent'}, 2, pre_depths, 0
  local named, counted = {}, {}
  local given = {} -- the recipients named by one message
  for item = 1, count do
    local base = (item - 1) * NF
    local sender, mode, rcpt = ARGV[base + 1], ARGV[base + 2], ARGV[base + 3]
    if not named[sender] then named[sender] = true; nn = nn + 1; names[nn] = sender end
    if mode ~= 'all' then -- a broadcast reads its recipients' fields with the whole hashes
      local sf = 's\n' .. sender
      if not counted[sf] then counted[sf] = true; nf = nf + 1; fields[nf] = sf end
      local ng = 1
      if mode == 'one' then
        given[1] = rcpt
      else
        ng = 0
        for name in string.gmatch(rcpt, '[^\n]+') do ng = ng + 1; given[ng] = name end
      end
      for i = 1, ng do
        local name = given[i]
        if name == 'parent' then
          pre_parents = true
        elseif name ~= sender then
          if not named[name] then named[name] = true; nn = nn + 1; names[nn] = name end
          -- the dampener's field too, before the limits say whether it is on (it is by
          -- default): read for nothing when it is off
          local pf, bf, df = pair_fields(sender, name, true)
          if not counted[pf] then
            counted[pf] = true
            nf = nf + 1; fields[nf] = pf
            nf = nf + 1; fields[nf] = df
          end
          if not counted[bf] then
            counted[bf] = true
            nf = nf + 1; fields[nf] = bf
            nd = nd + 1; depths[nd] = name
          end
        end
      end
    end
  end
  pre_nn, pre_nd = nn, nd
  rate_fields(rate, cached, fields, nf)
end

-- The channel's limits and pause switch, packed in the rate hash's '#lim' field by the first
-- accepted send: read with the call's rate fields (no command of its own) and unpacked by one
-- C call (cjson), numbers already numbers, instead of fifteen hash fields to read and convert.
-- Text, as the rest of the hash (a client that decodes replies can read it): JSON, numbers
-- written with 17 digits, so each reads back as the very number meta held. configure(),
-- pause() and resume() delete the field with their change to meta (one script,
-- configure.lua). The in-memory test double (fakeredis, whose cjson is not Redis') keeps the
-- values tab-separated.
local cfg, new_cfg = cached['#lim'], nil
if not cfg then
  cfg = limits_text(meta)
  if not cfg then
    local r = refuse('unknown_agent', 'no such channel')
    if count == 1 then return r end
    local out = {}
    for i = 1, count do out[i] = r end
    return out
  end
  new_cfg = cfg
end
local limits = limits_of(cfg)
local routing, sib, inbox_cap, max_body, max_name, pair_burst, pair_rate, snd_burst, snd_rate,
  max_chain, max_msgs, dampen_turns, dampen_window, deny_list, paused_flag,
  max_chain_msgs = unpack(limits, 1, 16)
local paused = paused_flag == 1
local siblings, open_routing = sib == '1', routing == 'open'
local family = not open_routing

-- one clock reading for the whole call (a 13-digit integer, which Lua writes out in full
-- wherever it is concatenated)
local now, now_s = clock() -- (the text converted once: one of Lua's slower steps)
-- the same numbers recur across a broadcast's recipients (equal inbox depths): each is
-- converted once per call
local digits = {}
local function str(n)
  local s = digits[n]
  if not s then s = n .. ''; digits[n] = s end
  return s
end

local first_turn = {} -- sender -> "0 now sender", the dampener value most sends write
-- the dampener's value for a pair after a message of `sender`: its turns, or "0 now sender"
local function turn_value(turns, sender)
  if turns > 0 then return turns .. ' ' .. now_s .. ' ' .. sender end
  local v = first_turn[sender]
  if not v then v = '0 ' .. now_s .. ' ' .. sender; first_turn[sender] = v end
  return v
end

-- What this call knows and will write. Sends change only the rate hash, the inbox depths,
-- the idempotency keys and the stream, so everything read here stays true for the call.
local status_of, parent_of = {}, {} -- member -> status / parent name, false: none
local depth_of, depth_dirty = {}, {} -- inbox depth now (read, plus this call's); to write
local idem_of, idem_new = nil, nil  -- idempotency field -> "id\tto"|false; to write (lazy)
local sent_any = false
local whole = false -- every member's inbox depth read (by a broadcast)

-- The status (and, with with_parents, the parent) of names not looked up yet. Open routing
-- needs no parents unless "parent" is named or a broadcast groups its receipts; membership is
-- read from the status hash (join writes both hashes, and nothing deletes from either).
local function members(names, nn, with_parents)
  local need, n = nil, 0
  for i = 1, nn do
    local name = names[i]
    if status_of[name] == nil then
      if not need then need = {} end
      n = n + 1
      need[n] = name
      status_of[name] = false -- also marks it as being fetched (duplicates)
    end
  end
  if not need then return end
  local st = call('HMGET', status, unpack(need, 1, n))
  for i = 1, n do status_of[need[i]] = st[i] or false end
  if not with_parents then return end
  local pa = call('HMGET', parents, unpack(need, 1, n))
  for i = 1, n do parent_of[need[i]] = pa[i] or false end
end

-- What the call's messages name, continued: the status (and parent) of every sender and named
-- recipient, and the inbox depth of every named recipient, one command per hash.
members(pre_names, pre_nn, pre_parents or family)
if pre_nd > 0 then
  local vals = call('HMGET', inbox, unpack(pre_depths, 1, pre_nd))
  for i = 1, pre_nd do depth_of[pre_depths[i]] = as_count(vals[i]) end
end

-- Before anything is written: the doorbell of every agent a message may go to is in KEYS,
-- else the call says which are missing and writes nothing (may_ring)
local miss, roster = may_ring(bells, ARGV, count, NF, status, parents, ids, status_of,
  parent_of, open_routing, siblings)
if miss then return miss end

-- The steps of send_message() that are more than a few lines, in the order it takes them
-- (the text rules, check_text, and the chain's, chain_of, are helpers of _limits.lua and
-- _chain.lua). A check returns nothing when the message may go on, else code, message, limit,
-- current (and retry_ms).

-- idempotent replay: the same sender and key return the first send's id. Returns the
-- idempotency field, and the replay's reply when the key was used before.
local function replay(sender, ikey)
  if ikey == '' then return nil end
  local ifield = sender .. '\n' .. ikey
  if not idem_of then idem_of, idem_new = {}, {} end
  local prev = idem_of[ifield]
  if prev == nil then
    prev = call('HGET', idem, ifield) or false
    idem_of[ifield] = prev
  end
  if not prev then return ifield end
  local tab = find(prev, '\t', 1, true)
  local sent_to = {}
  for n in string.gmatch(string.sub(prev, tab + 1), '[^\n]+') do sent_to[#sent_to + 1] = n end
  return ifield, {2, string.sub(prev, 1, tab - 1), sent_to}
end

-- a recipient as named (a member's name, an agent id or "parent"): its name, or nil and why
local function resolve(sender, sp, name)
  if name == 'parent' then
    if sp == '' then return nil, 'unknown_agent', 'a root agent has no parent' end
    return sp
  end
  if status_of[name] then return name end
  local resolved = call('HGET', ids, name)
  if not resolved then return nil, 'unknown_agent', 'no such agent: ' .. name end
  return resolved
end

-- a broadcast's recipients: every member the sender reaches, grouped by relation (parent,
-- siblings, children, the others), sorted by name in each group
local function everyone(sender, targets)
  -- every member with its parent, and its status, were read whole before the first message
  -- (may_ring); its inbox depth too, here, once a call: up to 128 fields Redis keeps a hash
  -- as a list, where every field named in an HMGET is a scan of it all
  local flat = roster
  if not whole then
    whole = true
    local ib = call('HGETALL', inbox)
    for i = 1, #ib, 2 do
      if depth_of[ib[i]] == nil then depth_of[ib[i]] = as_count(ib[i + 1]) end
    end
  end
  local sp = parent_of[sender] or ''
  local groups = {parent = {}, sibling = {}, child = {}, member = {}}
  for i = 1, #flat, 2 do
    local name, np = flat[i], flat[i + 1]
    if name ~= sender and bells[name] then -- (may_ring: all of them, unless "known")
      local rel, ok = reach(sender, sp, name, np, open_routing, siblings)
      if ok then local g = groups[rel]; g[#g + 1] = name end
    end
  end
  local nt = 0
  for _, rel in ipairs({'parent', 'sibling', 'child', 'member'}) do
    local g = groups[rel]
    table.sort(g)
    for i = 1, #g do nt = nt + 1; targets[nt] = g[i] end
  end
  return sp, nt
end

-- Scratch lists of send_message(), reused by every message (their counts say what is live):
-- the names given, the recipients resolved, the rate fields of each recipient, and of the
-- accepted ones their place in targets, the tokens left in their pair bucket and their turns.
-- seen[name] is the message that last resolved it (duplicates are dropped).
local names, targets, keyed, seen = {}, {}, {}, {}
local ok_at, ok_tokens, ok_turns = {}, {}, {}

-- One more message in the channel's budget, and in its reply chain's
local function count_message(depth, chain)
  cached['#sent'] = (tonumber(cached['#sent'] or '0') or 0) + 1
  dirty['#sent'] = true
  if depth > 0 and max_chain_msgs > 0 then
    local cf = 'c\n' .. chain
    cached[cf], dirty[cf] = tonumber(cached[cf] or '1') + 1, true
  end
end

-- The checks every message passes before its recipients: its text, the channel's message
-- budget, an open sender and a reply chain within its limits. Returns depth, chain; or nil and
-- the refusal. status_of[sender] and cached['#sent'] (when there is a budget) are read.
local function sender_checks(base, sender)
  local code, msg, limit, current = check_text(ARGV[base + 4], ARGV[base + 5], ARGV[base + 6],
    ARGV[base + 7], paused, max_body, max_name)
  if not code then code, msg, limit, current = check_budget(cached['#sent'], max_msgs) end
  if not code then code, msg = check_sender(status_of[sender]) end
  if code then return nil, refuse(code, msg, limit, current) end
  local depth, chain
  depth, chain, code, msg, limit, current =
    chain_of(stream, rate, cached, ARGV[base + 8], ARGV[base + 14], ARGV[base + 6], deny_list,
      max_chain, max_chain_msgs)
  if code then return nil, refuse(code, msg, limit, current) end
  return depth, chain
end

-- One message, every mode: returns its reply (see the header). A refusal of one recipient
-- refuses a "one" send; otherwise it is listed (name, code, message, limit, current, retry_ms)
-- in `refused`.
local function send_message(item, base)
  local sender, mode, rcpt_arg = ARGV[base + 1], ARGV[base + 2], ARGV[base + 3]
  local one = mode == 'one'
  -- a retry of an accepted send gets its first reply whatever changed since (a pause, a
  -- spent budget, a closed recipient): the idempotency key is looked up before any check
  local ifield, replayed = replay(sender, ARGV[base + 10])
  if replayed then return replayed end
  -- the channel's message budget
  if max_msgs > 0 and cached['#sent'] == nil then
    cached['#sent'] = call('HGET', rate, '#sent') or false
  end

  -- the names given ("parent" read as the sender's parent); their status (and parent)
  local nn, with_parents = 0, family
  if one then
    nn = 1; names[1] = rcpt_arg
    with_parents = family or rcpt_arg == 'parent'
  elseif mode == 'many' then
    for name in string.gmatch(rcpt_arg, '[^\n]+') do
      nn = nn + 1; names[nn] = name
      if name == 'parent' then with_parents = true end
    end
  end
  -- the sender is a member; the text, the budget, the sender and the chain pass
  if status_of[sender] == nil then members({sender}, 1, with_parents) end
  local depth, chain = sender_checks(base, sender)
  if not depth then return chain end
  local code, msg, limit, current, retry

  -- the recipients, in order; duplicates dropped
  local sp = ''
  if with_parents then
    if parent_of[sender] == nil then -- looked up without parents by an earlier message
      parent_of[sender] = call('HGET', parents, sender) or false
    end
    sp = parent_of[sender] or ''
  end
  local nt, refused, nr = 0, not one and {} or nil, 0
  -- a list's receipts in the order given (a name as resolved, or as given when refused)
  local order, no = mode == 'many' and {} or nil, 0
  if mode == 'all' then
    sp, nt = everyone(sender, targets)
    order, no = targets, nt
  else
    for i = 1, nn do
      local name = names[i]
      if name ~= 'parent' and status_of[name] == nil then members({name}, 1, family) end
      local resolved
      resolved, code, msg = resolve(sender, sp, name)
      if resolved and seen[resolved] ~= item then
        seen[resolved] = item
        if resolved == sender then
          name, code, msg = resolved, 'invalid_input', 'an agent cannot send to itself'
        else
          nt = nt + 1
          targets[nt] = resolved
          if order then no = no + 1; order[no] = resolved end
        end
      end
      if code then
        if one then return refuse(code, msg) end
        refused[nr + 1], refused[nr + 2], refused[nr + 3] = name, code, msg
        refused[nr + 4], refused[nr + 5], refused[nr + 6] = '', '', ''
        nr = nr + 6
        no = no + 1; order[no] = name
      end
    end
  end

  -- what the recipients' checks read and did not find known (an id's, "parent"'s, a
  -- broadcast's fields), one command per hash
  if nt > 0 then
    members(targets, nt, family and mode ~= 'all') -- a broadcast has every parent
    -- a broadcast is the sender's budget: no pair bucket, and the dampener does not count it
    local per_pair = mode ~= 'all'
    local dampen = dampen_turns > 0 and per_pair
    local sfield = 's\n' .. sender
    local fields, nf = nil, 0
    local need_depth, nd = nil, 0
    if cached[sfield] == nil then fields = {sfield}; nf = 1 end
    if cached['#sent'] == nil then
      if not fields then fields = {} end
      nf = nf + 1; fields[nf] = '#sent'
    end
    for i = 1, nt do
      local name = targets[i]
      local pf, bf, df = pair_fields(sender, name, dampen)
      if not per_pair then pf = false end
      local j = 3 * i
      keyed[j - 2], keyed[j - 1], keyed[j] = pf, bf, df
      if pf and cached[pf] == nil then
        if not fields then fields = {} end
        nf = nf + 1; fields[nf] = pf; cached[pf] = false
      end
      if cached[bf] == nil then
        if not fields then fields = {} end
        nf = nf + 1; fields[nf] = bf; cached[bf] = false
      end
      if df and cached[df] == nil then
        if not fields then fields = {} end
        nf = nf + 1; fields[nf] = df; cached[df] = false
      end
      if depth_of[name] == nil and whole then
        depth_of[name] = 0 -- the whole hash was read: no field, no messages
      elseif depth_of[name] == nil then
        if not need_depth then need_depth = {} end
        nd = nd + 1
        need_depth[nd] = name
        depth_of[name] = 0
      end
    end
    if nf > 0 then rate_fields(rate, cached, fields, nf) end
    if nd > 0 then
      local vals = call('HMGET', inbox, unpack(need_depth, 1, nd))
      for i = 1, nd do depth_of[need_depth[i]] = as_count(vals[i]) end
    end
  end

  -- each recipient's checks; the accepted ones' bucket spends and turns are applied only
  -- once the sender's own bucket has passed too
  local na = 0
  for i = 1, nt do
    local j = 3 * i
    local tokens, turns
    local name, df = targets[i], keyed[j]
    local dv = nil
    if df then dv = cached[df] end
    local pf, pv = keyed[j - 2], nil
    if pf then pv = cached[pf] end
    code, msg, limit, current, retry, tokens, turns =
      check_recipient(sender, sp, name, parent_of[name] or '', status_of[name], depth_of[name],
        cached[keyed[j - 1]], dv, pv, now, limits)
    if code then
      if one then return refuse(code, msg, limit, current, retry) end
      refused[nr + 1], refused[nr + 2], refused[nr + 3] = targets[i], code, msg
      refused[nr + 4], refused[nr + 5] = tostring(limit or ''), tostring(current or '')
      refused[nr + 6] = tostring(retry or '')
      nr = nr + 6
    else
      na = na + 1
      ok_at[na], ok_tokens[na], ok_turns[na] = i, tokens or false, turns
    end
  end
  if na == 0 then
    if one then return refuse('invalid_input', 'no recipient') end
    return {1, false, {}, refused, first_of(order, no)}
  end

  local sfield = 's\n' .. sender
  local s_ok, s_tokens, s_retry = bucket(cached[sfield], snd_burst, snd_rate, now)
  if not s_ok then
    return refuse('rate_limited', 'sender rate limit for ' .. sender, snd_burst, s_tokens, s_retry)
  end

  -- every check passed: count (written at the end of the call), append
  local accepted = not one and {} or nil
  for k = 1, na do
    local i = ok_at[k]
    local name, j, tokens = targets[i], 3 * i, ok_tokens[k]
    if tokens then spend(cached, dirty, keyed[j - 2], tokens, now_s) end
    local df = keyed[j]
    if df then cached[df], dirty[df] = turn_value(ok_turns[k], sender), true end
    depth_of[name], depth_dirty[name] = depth_of[name] + 1, true
    if accepted then accepted[k] = name end
  end
  count_message(depth, chain)
  if s_tokens then spend(cached, dirty, sfield, s_tokens, now_s) end
  local to = na == 1 and targets[ok_at[1]] or table.concat(accepted, '\n', 1, na)
  local id = append(base, to, depth, chain, mode == 'all')
  sent_any = true
  if ifield then
    local v = id .. '\t' .. to
    idem_of[ifield] = v
    idem_new[#idem_new + 1] = ifield
    idem_new[#idem_new + 1] = v
  end
  if one then return {1, id, to} end
  if nr > 0 then return {1, id, accepted, refused, first_of(order, no)} end
  return {1, id, accepted, refused}
end

-- A batch's message to one member named as such, without an idempotency key, whose every
-- field the reads before the first message found: send_message()'s checks (the same helpers,
-- in the same order, the same refusals) and counting, without its lists and lookups. Returns
-- nothing, before any check, when something is unknown: send_message() takes the message.
local damp, sender_field = dampen_turns > 0, {}
local function plain(base, sender, name)
  local st, sp, np = status_of[name], '', ''
  if not st or name == sender or name == 'parent' or status_of[sender] == nil then return end
  if family then
    sp, np = parent_of[sender], parent_of[name]
    if sp == nil or np == nil then return end
    sp, np = sp or '', np or ''
  end
  local pf, bf, df = pair_fields(sender, name, damp)
  local sfield = sender_field[sender]
  if not sfield then sfield = 's\n' .. sender; sender_field[sender] = sfield end
  local pv, bv, dv, queued = cached[pf], cached[bf], nil, depth_of[name]
  if pv == nil or bv == nil or queued == nil or cached[sfield] == nil
    or cached['#sent'] == nil then return end
  if df then dv = cached[df]; if dv == nil then return end end
  local depth, chain = sender_checks(base, sender)
  if not depth then return chain end
  local code, msg, limit, current, retry, tokens, turns
  code, msg, limit, current, retry, tokens, turns =
    check_recipient(sender, sp, name, np, st, queued, bv, dv, pv, now, limits)
  if code then return refuse(code, msg, limit, current, retry) end
  local s_ok, s_tokens, s_retry = bucket(cached[sfield], snd_burst, snd_rate, now)
  if not s_ok then
    return refuse('rate_limited', 'sender rate limit for ' .. sender, snd_burst, s_tokens, s_retry)
  end
  if tokens then spend(cached, dirty, pf, tokens, now_s) end
  if df then cached[df], dirty[df] = turn_value(turns, sender), true end
  depth_of[name], depth_dirty[name] = queued + 1, true
  count_message(depth, chain)
  if s_tokens then spend(cached, dirty, sfield, s_tokens, now_s) end
  sent_any = true
  return append(base, name, depth, chain, false)
end

local result
local out = count > 1 and {} or nil
for item = 1, count do
  local base = (item - 1) * NF
  result = nil
  if ARGV[base + 2] == 'one' and ARGV[base + 10] == '' then
    result = plain(base, ARGV[base + 1], ARGV[base + 3])
  end
  if not result then result = send_message(item, base) end
  if out then out[item] = result end
end

-- the counters of every appended message, one write per hash: the inbox depths as absolute
-- values (read above, nothing else changes them during the script), as strings (Redis turns
-- a Lua number into a command argument with a slow printf)
if sent_any then
  local kv, n = {}, 0
  for field in pairs(dirty) do
    local v = cached[field]
    if type(v) == 'table' then v = bucket_value(v[1], now_s) elseif type(v) == 'number' then v = str(v) end
    kv[n + 1], kv[n + 2], n = field, v, n + 2
  end
  if new_cfg then
    -- the limits cached (the string older versions cached them in goes). With them, the
    -- '#table' field: a value longer than Redis' hash-max-listpack-value (64 bytes by
    -- default) keeps the hash a hash table. Kept as a list (up to 128 fields), every field a
    -- broadcast writes would be a scan of the whole hash.
    kv[n + 1], kv[n + 2], kv[n + 3], n = '#lim', new_cfg, '#table', n + 3
    kv[n + 1], n = 'over 64 bytes, so Redis keeps this hash a table: one lookup per field, '
      .. 'not a scan of all', n + 1
    call('DEL', lim)
  end
  call('HSET', rate, unpack(kv, 1, n))
  kv, n = {}, 0
  for name in pairs(depth_dirty) do kv[n + 1], kv[n + 2], n = name, str(depth_of[name]), n + 2 end
  call('HSET', inbox, unpack(kv, 1, n))
  if idem_new and #idem_new > 0 then call('HSET', idem, unpack(idem_new)) end
end
return out or result
