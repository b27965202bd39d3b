-- repair.lua: rebuild every inbox counter of a channel from the stream itself.
--
-- KEYS[1] stream  KEYS[2] inbox
-- ARGV[1] budget: most entries to look at (a bound on the work of one call; 0 = no bound)
--
-- returns {complete (1|0), name, stored, counted, name, stored, counted, ...}: the counters
--   that were wrong, set to what the stream says (complete = 0: the bound was hit, nothing
--   was written)
--
-- An agent's undone messages are the entries addressed to it that its consumer group holds
-- pending (fetched, not yet done) plus those past its group cursor (not fetched yet). Counters
-- of agents without a group are dropped.

local stream, inbox, budget = KEYS[1], KEYS[2], tonumber(ARGV[1]) or 0
local looked = 0

local counted, cursors, low = {}, {}, nil
for _, g in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
  local name, last
  for i = 1, #g, 2 do
    if g[i] == 'name' then name = g[i + 1] elseif g[i] == 'last-delivered-id' then last = g[i + 1] end
  end
  cursors[name], counted[name] = last, 0
  if not low or id_before(last, low) then low = last end
  -- pending entries addressed to the agent
  local from = '-'
  while true do
    local p = redis.call('XPENDING', stream, name, from, '+', 1000)
    for _, e in ipairs(p) do
      local got = redis.call('XRANGE', stream, e[1], e[1])
      if got[1] and addressed(got[1][2], name) then counted[name] = counted[name] + 1 end
    end
    looked = looked + #p
    if budget > 0 and looked > budget then return {0} end
    if #p < 1000 then break end
    from = '(' .. p[#p][1]
  end
end

-- entries past each group's cursor, in one pass from the lowest cursor
if low then
  local from = '(' .. low
  while true do
    local batch = redis.call('XRANGE', stream, from, '+', 'COUNT', 1000)
    for _, e in ipairs(batch) do
      for i = 1, #e[2], 2 do
        if e[2][i] == 't' then
          for name in string.gmatch(e[2][i + 1], '[^\n]+') do
            local last = cursors[name]
            if last and id_before(last, e[1]) then counted[name] = counted[name] + 1 end
          end
        end
      end
    end
    looked = looked + #batch
    if budget > 0 and looked > budget then return {0} end
    if #batch < 1000 then break end
    from = '(' .. batch[#batch][1]
  end
end

local out = {1}
local stored = redis.call('HGETALL', inbox)
for i = 1, #stored, 2 do
  local name, value = stored[i], stored[i + 1]
  if counted[name] == nil then
    redis.call('HDEL', inbox, name)
    out[#out + 1] = name; out[#out + 1] = value; out[#out + 1] = 0
  elseif tonumber(value) ~= counted[name] then
    redis.call('HSET', inbox, name, counted[name])
    out[#out + 1] = name; out[#out + 1] = value; out[#out + 1] = counted[name]
  end
  counted[name] = counted[name] and -1 - counted[name]  -- seen: negative marks it
end
for name, n in pairs(counted) do
  if n >= 0 then -- a group whose counter was missing
    redis.call('HSET', inbox, name, n)
    out[#out + 1] = name; out[#out + 1] = ''; out[#out + 1] = n
  end
end
return out
