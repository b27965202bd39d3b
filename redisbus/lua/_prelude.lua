-- _prelude.lua: the helpers several scripts share, the first of the libraries (the files
-- whose name starts with "_"; _limits.lua and _chain.lua hold send.lua's). Not a script: a
-- Lua script cannot call another, so redisbus/_scripts.py puts the helpers a script calls in
-- front of it when it loads it, and each helper is written once, in a library. One paragraph
-- per helper (its comment, the locals it keeps for one call if any, then one local function),
-- each after the helpers it calls. A helper touches only the keys its caller passes in (from
-- its KEYS). Error line numbers in a loaded script count the helpers' lines first.

-- a TIME reply {seconds, microseconds} in milliseconds
local function time_ms(t)
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- the Redis clock in milliseconds (TIME; scripts replicate by effects, so this is safe)
local function now_ms()
  return time_ms(redis.call('TIME'))
end

-- a TIME reply {seconds, microseconds} in milliseconds, as text: cut from TIME's own digits
-- (writing a 13-digit number out costs Lua more than reading one in)
local function time_text(t)
  local us = t[2]
  local n = #us
  return t[1] .. (n > 3 and string.sub('00' .. string.sub(us, 1, n - 3), -3) or '000')
end

-- the Redis clock in milliseconds, as a number and as text (see time_text)
local function clock()
  local text = time_text(redis.call('TIME'))
  return tonumber(text), text
end

-- a write the script can do without (a read mark, a status, a counter repair.lua reconciles):
-- at maxmemory with noeviction Redis refuses a write that may grow memory until the script
-- has changed something (an XACK, an XDEL: those free memory), so draining goes on and such a
-- write is skipped (false) instead of failing the script. Any other error still raises.
local function soft(...)
  local r = redis.pcall(...)
  if type(r) == 'table' and r.err then
    -- ("OOM command not allowed …"; Redis 6.2 puts where it happened in front)
    if string.find(r.err, 'OOM command not allowed', 1, true) then return false end
    error(r.err)
  end
  return r
end

-- add `by` to `agent`'s count in hash `inbox` (HINCRBY). A count a raw write left no integer
-- is written anew (`by`, at least 0) instead of failing the script, so no send, wait or
-- mark_done stops on it (repair.lua gives the exact count). With `may_skip`, at maxmemory the
-- write is skipped (false), as soft does; any other error still raises.
local function count_in(inbox, agent, by, may_skip)
  local r = redis.pcall('HINCRBY', inbox, agent, by)
  if type(r) == 'table' and r.err then
    local e = tostring(r.err)
    if string.find(e, 'not an integer', 1, true) then
      local v = math.max(0, tonumber(by))
      redis.call('HSET', inbox, agent, v .. '')
      return v
    end
    if may_skip and string.find(e, 'OOM command not allowed', 1, true) then return false end
    error(r)
  end
  return r
end

-- a count as stored (an inbox depth): what a raw write left that is no finite number of at
-- least 0 reads as 0, so a script compares and writes a number (and the next count_in
-- rewrites it)
local function as_count(v)
  local n = tonumber(v or '0')
  if not n or n ~= n or n < 0 or n == math.huge then return 0 end
  return n
end

-- `cmd` on hash `key` with items[1..n] after the key, `per` of them a command (Lua's unpack
-- has a limit, and one huge command holds the server as long): the replies of a command that
-- answers with a list (HMGET), as one list in order; nothing (an empty list) for the others.
-- No command at all when n is 0.
local function chunked(cmd, key, items, n, per)
  if n <= per then
    if n == 0 then return {} end
    local r = redis.call(cmd, key, unpack(items, 1, n))
    return type(r) == 'table' and r or {}
  end
  local out, m = {}, 0
  for i = 1, n, per do
    local r = redis.call(cmd, key, unpack(items, i, math.min(n, i + per - 1)))
    if type(r) == 'table' then
      for k = 1, #r do m = m + 1; out[m] = r[k] end
    end
  end
  return out
end

-- the value of field `k` of a stream entry's flat {field, value, ...} list, or nil
local function field(f, k)
  for i = 1, #f, 2 do if f[i] == k then return f[i + 1] end end
  return nil
end

-- a ttl field's text as seconds, or nil when it is no finite number in (0, 1e9]: what a raw
-- write left there never breaks a script (the Python reader rejects such an entry as
-- malformed, _messages.py; here it simply has no ttl)
local function ttl_of(text)
  local v = tonumber(text or '')
  if v and v > 0 and v <= 1e9 then return v end
  return nil
end

-- is `name` one of the recipients ('t', names joined by "\n") of an entry's fields?
local function addressed(f, name)
  local to = field(f, 't')
  return to ~= nil and string.find('\n' .. to .. '\n', '\n' .. name .. '\n', 1, true) ~= nil
end

-- is receipt mark `mark` (or nil) one of a finished entry: done, dead-lettered (failed),
-- expired or rejected?
local function finished(mark)
  local c = mark and string.sub(mark, 1, 1)
  return c == 'D' or c == 'F' or c == 'X' or c == 'J'
end

-- is entry id `a` ("ms-seq") strictly before entry id `b`?
local function id_before(a, b)
  local am, as = string.match(a, '^(%d+)-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)-(%d+)$')
  am, bm = tonumber(am), tonumber(bm)
  if am ~= bm then return am < bm end
  return tonumber(as) < tonumber(bs)
end

-- the doorbells a call was given: `keys` from `first` on, in pairs, an agent's bell then its
-- wakeup list (see ring), by the agent's name: name -> {bell, wakeup}. A bell's key is the
-- channel's keys' common start (the stream's key, `stream`, less its last letter), 'b:' and
-- the name, its wakeup's the same with 'w:': the name is read off the key given, no key is
-- made from a name. A pair that is not both (a raw call's) is passed over, so the call is
-- refused for lack of it. What a bell's key says is kept (a Functions library keeps this memo
-- from call to call: up to 4,096 bells, then it starts again), so a send reads its
-- recipient's pair in one lookup instead of cutting and joining its keys.
local bell_memo, bell_memo_kept = {}, 0
local function doorbells(stream, keys, first)
  local out, base = {}, nil
  for i = first, #keys - 1, 2 do
    local bell = keys[i]
    local known = bell_memo[bell]
    if not known or known[4] ~= stream then
      known = nil
      base = base or string.sub(stream, 1, -2)
      local n = #base + 2
      if string.sub(bell, 1, n) == base .. 'b:' then
        local name = string.sub(bell, n + 1)
        known = {bell, base .. 'w:' .. name, name, stream}
        if bell_memo_kept == 4096 then bell_memo, bell_memo_kept = {}, 0 end
        bell_memo[bell], bell_memo_kept = known, bell_memo_kept + 1
      end
    end
    if known and keys[i + 1] == known[2] then out[known[3]] = known end
  end
  return out
end

-- The names of `names` (1 to `n`; false or nil where a name is unknown) whose doorbells the
-- call was not given (`bells`, from doorbells): nil when it was given them all, else the reply
-- that says so, {-1, name, ...}. A script that rings returns it before it writes anything:
-- the caller adds those doorbells to KEYS and calls again (redisbus/_bindings.py, unrung).
local function undeclared(bells, names, n)
  local miss, m, named = nil, 1, nil
  for i = 1, n do
    local name = names[i]
    if name and not bells[name] then
      if not miss then miss, named = {-1}, {} end
      if not named[name] then named[name] = true; m = m + 1; miss[m] = name end
    end
  end
  return miss
end

-- ring the doorbells of the agents named in `to` (names joined by "\n") for entry `id`: the id
-- appended to each agent's bell, a list of the entry ids rung for it that no wait has taken
-- yet; and, when that bell was empty, one item ('') in its wakeup list, which is what the
-- agent's waits block on (BLPOP). `bells` (from doorbells) holds both keys of every agent
-- named: the script checked that (undeclared) before its first write. Every bell carries the
-- channel's hash tag. A message thus wakes its recipients only, one replica each, and
-- wake.lua hands the entries the bell names to the replica woken. While a bell holds ids,
-- later rings only append (the one wakeup stands for them all): a list of one short item is
-- about 160 B, where a stream node is 4 KiB.
local function ring(bells, to, id)
  if not string.find(to, '\n', 1, true) then
    local b = bells[to]
    if redis.call('RPUSH', b[1], id) == 1 then redis.call('RPUSH', b[2], '') end
    return
  end
  for name in string.gmatch(to, '[^\n]+') do
    local b = bells[name]
    if redis.call('RPUSH', b[1], id) == 1 then redis.call('RPUSH', b[2], '') end
  end
end

-- replay record of signed entries: did an entry before `id` carry the (key, nonce) of its
-- signature field `sig` ("kid:nonce:...")? `nonces` maps "kid:nonce" to the first entry id
-- seen with it, `nonce_at` holds when (ms) it was recorded. Copies always come later in the
-- stream than their original (XADD ids only grow), so the first id wins, whichever recipient
-- saw which first. With `record`, remember `id` as the first when no earlier one is known.
local function seen_before(nonces, nonce_at, id, sig, now, record)
  local kid, nonce = string.match(sig, '^([^:]*):([^:]*):')
  if not nonce or nonce == '' then return false end
  local tag = kid .. ':' .. nonce
  local first = redis.call('HGET', nonces, tag)
  if first and id_before(first, id) then return true end
  if record and first ~= id then
    if soft('HSET', nonces, tag, id) then soft('ZADD', nonce_at, now, tag) end
  end
  return false
end

-- reject entry `id` of `agent` that failed a check, for `reason`: acknowledged, the inbox
-- counted down, marked "J<ms>:REASON" (its receipt says rejected). Returns 1 when it was
-- pending
local function reject(stream, inbox, marks, agent, id, reason, now_s)
  if redis.call('XACK', stream, agent, id) == 1 then
    count_in(inbox, agent, -1)
    redis.call('HSET', marks, id .. '\n' .. agent, 'J' .. now_s .. ':' .. reason)
    return 1
  end
  return 0
end

-- keep `agent`'s inbox count at least what its group holds pending: an entry a raw XADD wrote
-- was never counted in, so counting its rejection (or retirement) down could take the count
-- below what the agent holds, and the inbox cap would then admit more than it should
-- (repair.lua gives the exact count)
local function floor_pending(stream, inbox, agent)
  local ok, p = pcall(redis.call, 'XPENDING', stream, agent)
  local held = ok and tonumber(p[1]) or 0
  if (tonumber(redis.call('HGET', inbox, agent) or '') or 0) < held then
    soft('HSET', inbox, agent, held)
  end
end

-- copy entry `id` (its fields `f`), delivered `deliveries` times to `agent`, to the
-- dead-letter stream `dlq` (the caller acknowledges it and counts the inbox down). Returns
-- false when Redis is at maxmemory (see soft): the caller then leaves the entry pending, to be
-- dead-lettered once there is room
local function dead_letter(dlq, id, agent, deliveries, f, now)
  local fields = {'o', id, 'a', agent, 'n', tostring(deliveries), 'w', 'max_deliveries',
    'dead_ms', tostring(now)}
  -- the entry's own fields follow, but its 'a' (a broadcast's flag) would shadow the
  -- recipient, and its signature and signing time ('g', 'n') are kept as 'og' and 'on': 'n'
  -- here is the deliveries, and a replay is signed anew by the host replaying it
  local rename = {g = 'og', n = 'on'}
  for i = 1, #f, 2 do
    local k = f[i]
    if k ~= 'a' then fields[#fields + 1] = rename[k] or k; fields[#fields + 1] = f[i + 1] end
  end
  return soft('XADD', dlq, '*', unpack(fields)) ~= false
end

-- circuit breaker: count a dead letter of `who` in the channel's rate hash; enough within the
-- window (meta's breaker_* fields) open its breaker "failures first_ms until_ms", which
-- send.lua reads before every delivery to `who`
local function trip(meta, rate, who, now)
  local cfg = redis.call('HMGET', meta, 'breaker_failures', 'breaker_window_s', 'breaker_cooldown_s')
  local limit = tonumber(cfg[1] or '0')
  if limit <= 0 then return end
  local window, cool = tonumber(cfg[2] or '0') * 1000, tonumber(cfg[3] or '0') * 1000
  local v = redis.call('HGET', rate, 'b\n' .. who)
  local n, first = 0, now
  if v then
    local a, b = string.match(v, '^(%d+) (%d+)')
    n, first = tonumber(a), tonumber(b)
    if now - first > window then n, first = 0, now end
  end
  n = n + 1
  local until_ms = 0
  if n >= limit then n, first, until_ms = 0, now, now + cool end
  redis.call('HSET', rate, 'b\n' .. who, n .. ' ' .. first .. ' ' .. until_ms)
end

-- keep hash `key` a hash table for good, whatever it holds: one field ('\n#table', which no
-- "ID\nAGENT" or "SENDER\nKEY" field can be: an entry id and a sender are never empty) whose
-- value is longer than hash-max-listpack-value. For the hashes that grow with the traffic and
-- are only ever looked up a field at a time (the receipt marks, the idempotency keys): kept as
-- a list, up to hash-max-listpack-entries fields (512 by default), every mark a wake-up, read
-- or mark_done looks up or writes is a scan of them all (at 300 marks, 18% of a message's
-- server instructions, callgrind). Unlike as_table's, this table survives a restart: Redis
-- reloads a hash holding a long value as a table. It costs a channel about 300 bytes a hash
-- while it has no fields. Skipped at maxmemory under EVALSHA (soft); a function with the flag
-- allow-oom (join, sweep) makes the table there too: a list of up to 512 fields, once.
-- Returns 1 when it wrote the field.
local function keep_table(key)
  return soft('HSETNX', key, '\n#table', 'a value over 64 bytes: Redis keeps this hash a table, '
    .. 'one lookup per field, not a scan of all')
end

-- make hash `key` a hash table if Redis still keeps it as a list. Up to
-- hash-max-listpack-entries fields (512 by default) Redis keeps a hash as a list, where every
-- field a command names is a scan of them all: at 100 members, each inbox depth a broadcast
-- writes costs about 10,000 instructions. A value longer than hash-max-listpack-value (64
-- bytes by default) turns the list into a table, and Redis never turns it back; the field
-- that carries it (a name no member can have: members' names hold no control characters) is
-- gone again at once, so the hash holds what it held. (The rate hash keeps its long value
-- for good, the '#table' field send.lua writes with the limits: no command of its own. The
-- hashes this is for hold their members' fields and nothing else.) Skipped at maxmemory
-- under EVALSHA (soft); under allow-oom (join, sweep) the table is made there too, once.
-- An RDB reload makes such a hash, if it fits, a list again: sweep.lua looks (OBJECT ENCODING).
local function as_table(key)
  if keep_table(key) == 1 then redis.call('HDEL', key, '\n#table') end
end

-- after fields of a hash keep_table keeps were deleted: when keep_table's field is all that is
-- left, the hash is made anew (`again`) or let go. Returns how many fields it holds now.
-- Redis shrinks a hash table only a step at a time as commands use it, so a hash emptied
-- after a burst kept its peak's buckets (590 KB after 39,800 marks, until the next traffic)
-- where the list it was before went with its last field.
local function renew_table(key, again)
  local n = redis.call('HLEN', key)
  if n == 1 and redis.call('HEXISTS', key, '\n#table') == 1 then
    redis.call('DEL', key)
    if again then keep_table(key) end
    return 0
  end
  return n
end
