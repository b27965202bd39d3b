-- sweep.lua: the janitor's pass over one channel. Safe on many hosts at once (atomic).
--
-- KEYS[1] stream  KEYS[2] inbox  KEYS[3] marks  KEYS[4] idem  KEYS[5] dlq  KEYS[6] meta
-- KEYS[7] rate (token buckets, dampeners, circuit breakers, chain counts)
-- KEYS[8] nonces  KEYS[9] nonce_at: the nonce times (the replay record of signed entries)
-- KEYS[10] status
-- ARGV[1] lease (ms)  ARGV[2] max_deliveries  ARGV[3] retention (ms)
-- ARGV[4] idle time (ms) after which a consumer with nothing pending is removed
-- ARGV[5] budget: the work per call: at most this many entries trimmed, and at most this many
--         groups, pending entries, consumers and rate fields examined (the next call carries
--         on after the last group this one visited: meta field sweep_after)
-- ARGV[6] keep: the replay horizon (ms): the replay record forgets pairs older than this
--         (0: leave it)
--
-- returns {trimmed, dead_lettered, consumers_removed, expired_undone, rate_pruned,
--          rate_scanning (1 while the walk over the rate hash has not come round)}
--
-- 1. Dead-letter pending entries idle past the lease that were handed out max_deliveries
--    times (live replicas reclaim the others; see claim.lua, which says how hand-outs are
--    counted: an entry with no receipt mark was fetched ahead and never handed out).
-- 2. Trim the stream's prefix that no recipient needs any more: entries every recipient is
--    done with (their receipt marks say done, failed or expired), and entries older than the
--    retention, whose undone recipients are acknowledged and counted down. Their receipt
--    marks and idempotency keys go with them (a hash left with keep_table's field alone is
--    made anew: see renew_table).
-- 3. Remove consumers idle past ARGV[4] that have nothing pending (never one with pending
--    entries: they would become unclaimable).
-- 4. Forget rate state that says nothing any more (see below), so the rate hash follows the
--    pairs that are active, not every pair that ever was.
-- 5. Forget the replay record's pairs past the horizon (each fetch forgets only a few): a
--    copy of an entry that old is stale anyway (its signing time is outside the window).
-- 6. Keep the hashes looked up a field at a time hash tables: the receipt marks and
--    idempotency keys of a channel an older version made, and the replay record while it
--    holds pairs, get keep_table's field (HSETNX: nothing written when it is there), and the
--    inbox depths and statuses of a channel past 16 members, which join.lua made tables
--    (as_table) and a restart reloaded as lists (an RDB reload makes a hash that fits a list a
--    list), are made tables again.

local stream, inbox, marks, idem, dlq, meta = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local rate, status = KEYS[7], KEYS[10]
local lease, max_deliveries, retention = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local consumer_idle, budget = tonumber(ARGV[4]), tonumber(ARGV[5])
local nonces, nonce_at, keep = KEYS[8], KEYS[9], tonumber(ARGV[6] or '') or 0
local now = now_ms()

-- 5 first: it needs no stream, and frees memory before anything else writes
if keep > 0 and nonce_at then
  local forgot = 0
  while forgot < 100 * budget do -- (1,000 pairs take about a millisecond)
    local old = redis.call('ZRANGEBYSCORE', nonce_at, '-inf', now - keep, 'LIMIT', 0, 1000)
    if not old[1] then break end
    redis.call('HDEL', nonces, unpack(old))
    redis.call('ZREM', nonce_at, unpack(old))
    forgot = forgot + #old
  end
end
if redis.call('EXISTS', stream) == 0 then return {0, 0, 0, 0} end
local function next_id(id)
  local m, s = string.match(id, '^(%d+)-(%d+)$')
  return m .. '-' .. (tonumber(s) + 1)
end

local groups = redis.call('XINFO', 'GROUPS', stream)
local dead, removed = 0, 0
-- start after the group the previous call visited last, wrapping around, so a budget smaller
-- than the channel's work still reaches every group over successive calls
local resume = redis.call('HGET', meta, 'sweep_after') or ''
local first = 1
for i, g in ipairs(groups) do
  local name
  for j = 1, #g, 2 do if g[j] == 'name' then name = g[j + 1] end end
  if name == resume then first = i % #groups + 1 break end
end
local left, swept_to = budget, resume
for n = 0, #groups - 1 do
  if left <= 0 then break end
  local g = groups[(first - 1 + n) % #groups + 1]
  local name, last, pending
  for i = 1, #g, 2 do
    if g[i] == 'name' then name = g[i + 1]
    elseif g[i] == 'last-delivered-id' then last = g[i + 1]
    elseif g[i] == 'pending' then pending = tonumber(g[i + 1]) end
  end
  left = left - 1
  -- 1. dead letters
  if pending > 0 and left > 0 then
    local pel = redis.call('XPENDING', stream, name, 'IDLE', lease, '-', '+', left)
    left = left - #pel
    for _, p in ipairs(pel) do
      -- hand-outs (claim.lua): the counter, once the entry was handed out and marked read
      local key = p[1] .. '\n' .. name
      local due = tonumber(p[4]) >= max_deliveries and redis.call('HEXISTS', marks, key) == 1
      local e = due and redis.call('XRANGE', stream, p[1], p[1])[1]
      if e and not dead_letter(dlq, p[1], name, p[4], e[2], now) then due = false end -- (no room)
      if due then
        if redis.call('XACK', stream, name, p[1]) == 1 then
          if e then redis.call('HSET', marks, key, 'F' .. now .. ':max_deliveries') end
          count_in(inbox, name, -1)
          dead = dead + 1
          trip(meta, rate, name, now)
        end
      end
    end
  end
  -- 3. idle consumers with nothing pending
  if left > 0 then
    local consumers = redis.call('XINFO', 'CONSUMERS', stream, name)
    left = left - #consumers
    for _, c in ipairs(consumers) do
      local cname, cpending, idle
      for i = 1, #c, 2 do
        if c[i] == 'name' then cname = c[i + 1]
        elseif c[i] == 'pending' then cpending = tonumber(c[i + 1])
        elseif c[i] == 'idle' then idle = tonumber(c[i + 1]) end
      end
      if cpending == 0 and idle > consumer_idle then
        redis.call('XGROUP', 'DELCONSUMER', stream, name, cname)
        removed = removed + 1
      end
    end
  end
  swept_to = name
  if n == #groups - 1 then swept_to = '' end -- a full round: start from the first next time
end
if swept_to ~= resume then soft('HSET', meta, 'sweep_after', swept_to) end

-- 2. trim the prefix of the stream that nobody needs: entries whose every recipient is done
--    with them (done, dead-lettered or expired), and entries older than the retention. The
--    stream is walked in batches that start small (the walk mostly stops at the first entry
--    someone still holds) and double up to 200; a batch's receipt marks are read with one
--    HMGET (at most 1,000 fields a command), whether a name is a member once per call, and
--    the marks and idempotency keys of what goes are deleted 1,000 fields a command.
keep_table(marks) -- (6.)
keep_table(idem)
local cut_ms = now - retention
local nd, last, expired, retired = 0, nil, 0, {}
local gone, ng, ikeys, nk = {}, 0, {}, 0 -- the trimmed entries' marks and idempotency keys
local member = {} -- name -> has an inbox count (a raw write's name may be no member)
local cursor, stop, size = '-', false, 16
while not stop and nd < budget do
  local batch = redis.call('XRANGE', stream, cursor, '+', 'COUNT', math.min(size, budget - nd))
  local nb = #batch
  if nb == 0 then break end
  size = math.min(size * 2, 200)
  -- every entry's recipients, and their marks ("ID\nname") in one look
  local names, fields, nf = {}, {}, 0
  for j = 1, nb do
    local id, f = batch[j][1], batch[j][2]
    local to = ''
    for i = 1, #f, 2 do if f[i] == 't' then to = f[i + 1] end end
    local list, n = {}, 0
    for name in string.gmatch(to, '[^\n]+') do
      n = n + 1; list[n] = name
      nf = nf + 1; fields[nf] = id .. '\n' .. name
    end
    names[j] = list
  end
  local mark = chunked('HMGET', marks, fields, nf, 1000)
  local at = 0 -- the entry's first field in `fields`
  for j = 1, nb do
    local id, f, list = batch[j][1], batch[j][2], names[j]
    local old = tonumber(string.match(id, '^(%d+)')) < cut_ms
    local undone, nu = {}, 0
    for k = 1, #list do
      -- done, dead-lettered, expired or rejected (J) are finished; a name that is no member
      -- (a raw write's) has nothing to count
      local name = list[k]
      if not finished(mark[at + k] or nil) then
        local m = member[name]
        if m == nil then m = redis.call('HEXISTS', inbox, name) == 1; member[name] = m end
        if m then nu = nu + 1; undone[nu] = name end
      end
    end
    if nu > 0 and not old then stop = true break end
    for k = 1, nu do
      -- undone and past retention: retire it so counters stay true
      local name = undone[k]
      pcall(redis.call, 'XACK', stream, name, id) -- if it was pending
      retired[name] = (retired[name] or 0) + 1 -- counted down once the trim freed memory
      expired = expired + 1
    end
    nd, last = nd + 1, id
    for k = 1, #list do ng = ng + 1; gone[ng] = fields[at + k] end
    local sender, key
    for i = 1, #f, 2 do
      if f[i] == 'f' then sender = f[i + 1] elseif f[i] == 'i' then key = f[i + 1] end
    end
    if sender and key then nk = nk + 1; ikeys[nk] = sender .. '\n' .. key end
    at = at + #list
  end
  cursor = '(' .. batch[nb][1]
end
chunked('HDEL', marks, gone, ng, 1000)
chunked('HDEL', idem, ikeys, nk, 1000)
if ng > 0 then renew_table(marks, true) end
if nk > 0 then renew_table(idem, true) end
local trimmed = 0
if last then trimmed = redis.call('XTRIM', stream, 'MINID', next_id(last)) end
for name, n in pairs(retired) do
  count_in(inbox, name, -n, true)
  floor_pending(stream, inbox, name)
end

-- 4. send.lua writes a field per sender, pair, dampened pair, breaker and chain: a broadcast
--    to n members writes n. Drop those that read the same as no field: a token bucket
--    refilled to its burst ("tokens last_ms"), a dampener past its window ("turns at_ms
--    last"), a breaker closed and past its window ("failures first_ms until_ms"), a chain's
--    message count once its first message ("c\nID") is past the retention. The walk is an
--    HSCAN from a cursor kept in the hash ('#scan'), about `budget` fields per call.
local cfg = redis.call('HMGET', meta, 'pair_rate_burst', 'pair_rate_per_s', 'sender_rate_burst',
  'sender_rate_per_s', 'dampen_window_s', 'breaker_window_s')
local pair_burst, pair_rate = tonumber(cfg[1] or '0'), tonumber(cfg[2] or '0')
local snd_burst, snd_rate = tonumber(cfg[3] or '0'), tonumber(cfg[4] or '0')
local dampen_window = tonumber(cfg[5] or '0') * 1000
local breaker_window = tonumber(cfg[6] or '0') * 1000
local function refilled(v, burst, per_s)
  if burst <= 0 or per_s <= 0 then return true end -- the bucket is off: send.lua ignores it
  local tokens, last = string.match(v, '^(%S+) (%d+)$')
  if not last then return false end
  return tonumber(tokens) + (now - tonumber(last)) * per_s / 1000 >= burst
end
local function idle(field, v)
  local kind = string.sub(field, 1, 2)
  if kind == 'p\n' then return refilled(v, pair_burst, pair_rate) end
  if kind == 's\n' then return refilled(v, snd_burst, snd_rate) end
  if kind == 'd\n' then
    local at = string.match(v, '^%d+ (%d+)')
    return at ~= nil and now - tonumber(at) > dampen_window
  end
  if kind == 'b\n' then
    local first, until_ms = string.match(v, '^%d+ (%d+) (%d+)$')
    return first ~= nil and tonumber(until_ms) <= now and now - tonumber(first) > breaker_window
  end
  if kind == 'c\n' then
    local ms = string.match(field, '^c\n(%d+)%-%d+$')
    return ms ~= nil and tonumber(ms) < cut_ms
  end
  return false -- '#sent', '#table', '#scan'
end
-- '#scan' holds "cursor fields_pruned_this_round"; a round that pruned more fields than it
-- left copies the rest into a fresh hash: Redis (before 7.4) never shrinks a hash's table,
-- so a hash once holding a broadcast's pairs would keep their memory.
local scan, round = string.match(redis.call('HGET', rate, '#scan') or '0 0', '^(%d+) (%d+)$')
round = tonumber(round)
local examined, pruned = 0, 0
repeat
  local r = redis.call('HSCAN', rate, scan, 'COUNT', math.min(budget, 500))
  scan = r[1]
  local flat, gone, ng = r[2], {}, 0
  for i = 1, #flat, 2 do
    if idle(flat[i], flat[i + 1]) then ng = ng + 1; gone[ng] = flat[i] end
  end
  examined = examined + #flat / 2
  chunked('HDEL', rate, gone, ng, 500)
  pruned = pruned + ng
until scan == '0' or examined >= budget
round = round + pruned
if scan ~= '0' then
  soft('HSET', rate, '#scan', scan .. ' ' .. round)
else
  redis.call('HDEL', rate, '#scan')
  local left = redis.call('HLEN', rate)
  if round > left and left > 0 and left <= budget then
    local flat = redis.call('HGETALL', rate)
    redis.call('DEL', rate)
    chunked('HSET', rate, flat, #flat, 1000)
  end
end
-- 6. (the marks' and keys' field is looked for before the trim, which renews them emptied).
--    The replay record is kept a table while it holds pairs, and goes with its last one as
--    it did before the field (fetches forget pairs too): no record on a channel that does not
--    sign, though keep is never 0.
if keep > 0 and nonce_at and renew_table(nonces, false) > 0 then keep_table(nonces) end
if redis.call('HLEN', inbox) > 16 then
  for _, key in ipairs({inbox, status}) do
    local ok, kind = pcall(redis.call, 'OBJECT', 'ENCODING', key)
    if ok and (kind == 'listpack' or kind == 'ziplist') then as_table(key) end
  end
end
return {trimmed, dead, removed, expired, pruned, scan == '0' and 0 or 1}
