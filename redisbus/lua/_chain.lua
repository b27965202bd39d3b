-- _chain.lua: the helpers of send.lua's chain rules (chain depth, the chain's message budget,
-- loop protection of automatic answers). Not a script: see _prelude.lua (one paragraph per
-- helper; a helper touches only the keys its caller passes in, and sees only its arguments).

-- The chain a message continues, and its rules. Its parent is the message it answers
-- (`reply_to`) or, failing that, the one its sender is handling (`cause`: a new message sent
-- between wait() and mark_done(), or inside a serve handler), read from `stream`. A message
-- with a parent is one deeper in the parent's chain, whose id is the entry id of the chain's
-- first message ("h"; a message without one starts a chain of its own). A chain is refused
-- past `max_chain` (max_chain_depth) and past `max_msgs` (max_chain_messages) messages, its
-- count "c\nID" in the rate hash `rate` (the first message included; read through the call's
-- copy `cached`); so a ring of agents each sending a new message for every one it handles
-- stops. An auto_reply (`mtype`) never answers an auto_reply, nor a sender of `deny_list`
-- (names joined by "\n"), nor is sent while its sender handles one of those. Returns the depth, the chain's id ("" for none), then the refusal
-- (code, message, limit, current).
local function chain_of(stream, rate, cached, reply_to, cause, mtype, deny_list, max_chain,
                        max_msgs)
  local parent = reply_to ~= '' and reply_to or cause
  if parent == '' then return 0, '' end
  if not string.find(parent, '^%d+%-%d+$') then
    return 0, '', 'invalid_input', (parent == reply_to and 'reply_to' or 'cause')
      .. ' is not a message id'
  end
  -- when the parent was trimmed: counted as a first reply, in a chain of its own
  local depth, chain = 1, parent
  local e = redis.call('XRANGE', stream, parent, parent)
  if e[1] then
    local f, ptype, pdepth, psender = e[1][2], 'message', 0, ''
    for i = 1, #f, 2 do
      local k = f[i]
      if k == 'k' then ptype = f[i + 1]
      elseif k == 'd' then -- (what a raw write left there counts as 0: see ttl_of)
        local v = tonumber(f[i + 1])
        pdepth = (v and v >= 0 and v < 1e9) and math.floor(v) or 0
      elseif k == 'h' then chain = f[i + 1]
      elseif k == 'f' then psender = f[i + 1] end
    end
    depth = pdepth + 1
    if mtype == 'auto_reply' then -- (an answer, or sent while handling it: either is automatic)
      if ptype == 'auto_reply' then
        return depth, chain, 'loop', 'an auto_reply never answers an auto_reply', 0, 1
      end
      if string.find('\n' .. deny_list .. '\n', '\n' .. psender .. '\n', 1, true) then
        return depth, chain, 'loop',
          'no automatic answer to ' .. psender .. ' (deny-listed sender)', 0, 1
      end
    end
  end
  if depth > max_chain then
    return depth, chain, 'chain_too_deep', 'chain too deep (replies, and messages sent while '
      .. 'handling one)', max_chain, depth
  end
  if max_msgs > 0 then
    local cf = 'c\n' .. chain
    local n = cached[cf]
    if n == nil then
      n = redis.call('HGET', rate, cf) or false
      cached[cf] = n
    end
    n = tonumber(n or '1')
    if n >= max_msgs then
      return depth, chain, 'chain_too_deep', 'chain message budget spent', max_msgs, n
    end
  end
  return depth, chain
end
