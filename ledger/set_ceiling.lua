--[[
set_ceiling: set one dimension's ceiling, its kind and its period.

KEYS  the six ledger keys of the tenant, in the order documented in lib.lua
ARGV  [1] operation id (makes the call idempotent)
      [2] dimension
      [3] ceiling, an integer in 0..2^53
      [4] 1 hard, 0 soft
      [5] period: none, day or month
      [6] journal length (approximate cap)

Replies:
  { 'set', replayed (0|1) }   replayed: this operation id already did exactly this
  { 'conflict' }              this operation id already did something else; nothing written
  { 'invalid', message }      nothing written
Pending reservations keep the bucket they were admitted in; the new ceiling and period apply
to reservations admitted from now on.
]]

local now = ledger_now()
local op, dim, hard, period = ARGV[1], ARGV[2], ARGV[4], ARGV[5]
local ceiling, maxlen = ledger_int(ARGV[3]), ledger_int(ARGV[6])
if not ledger_valid_id(op) then
  return { 'invalid', 'operation id must be 1..256 characters with no spaces' }
end
if type(dim) ~= 'string' or #dim > 64 or not string.find(dim, '^[a-z][a-z0-9_]*$') then
  return { 'invalid', 'bad dimension name: ' .. tostring(dim) }
end
if ceiling == nil then
  return { 'invalid', 'ceiling must be an integer in 0..2^53' }
end
if hard ~= '0' and hard ~= '1' then
  return { 'invalid', 'hard must be 0 or 1' }
end
if period ~= 'none' and period ~= 'day' and period ~= 'month' then
  return { 'invalid', 'period must be none, day or month' }
end
if maxlen == nil or maxlen < 1 then
  return { 'invalid', 'journal length must be a positive integer' }
end

ledger_expire_due(KEYS, now, LEDGER_EXPIRE_BATCH, maxlen)

local entry = string.format('%d', ceiling) .. '|' .. hard .. '|' .. period
local fingerprint = dim .. '=' .. entry
local seen = redis.call('HGET', KEYS[3], 'o:' .. op)
if seen then
  if seen == fingerprint then
    return { 'set', 1 }
  end
  return { 'conflict' }
end
redis.call('HSET', KEYS[1], dim, entry)
redis.call('HSET', KEYS[3], 'o:' .. op, fingerprint)
redis.call('ZADD', KEYS[5], now, 'o:' .. op)
redis.call('XADD', KEYS[6], 'MAXLEN', '~', maxlen, '*', 'op', 'set_ceiling', 'id', op,
  'at_ms', string.format('%d', now), 'changes', '', 'dimension', dim,
  'ceiling', string.format('%d', ceiling), 'hard', hard, 'period', period)
return { 'set', 0 }
