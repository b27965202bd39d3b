-- receipt.lua: the state of one message for each of its recipients, read from the consumer
-- groups themselves (cursor and pending entries) and the receipt marks, in one atomic look.
--
-- KEYS[1] stream  KEYS[2] marks
-- ARGV[1] entry id
--
-- returns {now_ms}                                   when the entry is not (or no longer) there
--      or {now_ms, ttl_s or "", {name, passed (0|1), pending_idle_ms (-1: not pending), mark}, ...}
--   passed: the recipient's group cursor is at or past the entry (it has been fetched)

local stream, marks, id = KEYS[1], KEYS[2], ARGV[1]
local now = now_ms()
local e = redis.call('XRANGE', stream, id, id)
if not e[1] then return {now} end
local to, ttl = '', ''
local f = e[1][2]
for i = 1, #f, 2 do
  if f[i] == 't' then to = f[i + 1] elseif f[i] == 'x' then ttl = f[i + 1] end
end

local function before_or_equal(a, b) -- entry ids "ms-seq"
  local am, as = string.match(a, '^(%d+)-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)-(%d+)$')
  am, bm = tonumber(am), tonumber(bm)
  if am ~= bm then return am < bm end
  return tonumber(as) <= tonumber(bs)
end

local cursors = {}
for _, g in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
  local name, last
  for i = 1, #g, 2 do
    if g[i] == 'name' then name = g[i + 1] elseif g[i] == 'last-delivered-id' then last = g[i + 1] end
  end
  cursors[name] = last
end

local out = {now, ttl}
for name in string.gmatch(to, '[^\n]+') do
  local last = cursors[name]
  local passed = 0
  if last and before_or_equal(id, last) then passed = 1 end
  local idle = -1
  if last then
    local p = redis.call('XPENDING', stream, name, id, id, 1)
    if p[1] then idle = tonumber(p[1][3]) end
  end
  out[#out + 1] = {name, passed, idle, redis.call('HGET', marks, id .. '\n' .. name) or ''}
end
return out
