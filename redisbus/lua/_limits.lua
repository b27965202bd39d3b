-- _limits.lua: the helpers of send.lua's limits: the token buckets, breakers and dampeners of
-- the channel's rate hash, the text rules and the routing rule. Not a script: see
-- _prelude.lua (one paragraph per helper, each after the helpers it calls; a helper touches
-- only the keys its caller passes in). A helper sees only its arguments and its own memo (the
-- locals of its paragraph, made anew on every call of the script): the script passes it the
-- clock, the channel's limits and the tables it keeps.

-- "tokens now_ms": the value of a bucket left with `tokens` at `now_s` (the call's clock, as
-- text). The same numbers recur across a broadcast's recipients (full buckets): each value is
-- made once per call.
local bucket_values = {}
local function bucket_value(tokens, now_s)
  local s = bucket_values[tokens]
  if not s then s = tokens .. ' ' .. now_s; bucket_values[tokens] = s end
  return s
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

-- The rate fields of a pair, named once per call: the sender's pair bucket, the recipient's
-- breaker and (when the dampener is on and `dampen` asks for it) the pair's dampener, which
-- one unordered pair shares.
local pair_names, breaker_names, damper_names = {}, {}, {}
local function pair_fields(sender, name, dampen)
  local pairs_of = pair_names[sender]
  if not pairs_of then pairs_of = {}; pair_names[sender] = pairs_of end
  local pf = pairs_of[name]
  if not pf then pf = 'p\n' .. sender .. '\n' .. name; pairs_of[name] = pf end
  local bf = breaker_names[name]
  if not bf then bf = 'b\n' .. name; breaker_names[name] = bf end
  if not dampen then return pf, bf, false end
  local dampers = damper_names[sender]
  if not dampers then dampers = {}; damper_names[sender] = dampers end
  local df = dampers[name]
  if not df then
    if name < sender then df = 'd\n' .. name .. '\n' .. sender
    else df = 'd\n' .. sender .. '\n' .. name end
    dampers[name] = df
  end
  return pf, bf, df
end

-- ping-pong dampener "turns at_ms last_sender" of a pair (`v`, or false), as seen at `now`
-- with a `window` (ms): the turns a send to `name` would make
local function dampened(v, name, now, window)
  if not v then return 0 end
  local n, at, last = string.match(v, '^(%d+) (%d+) (.*)$')
  if not at or now - at > window then return 0 end
  if last == name then return n + 1 end
  return n + 0
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
