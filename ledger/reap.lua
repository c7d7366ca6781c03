--[[
reap: charge due expiries in deadline order and prune old resolved records.

KEYS  the six ledger keys of the tenant, in the order documented in lib.lua
ARGV  [1] batch: most expiries and most prunings this call does
      [2] retention in ms: resolved records older than this are forgotten
      [3] journal length (approximate cap)

Reply: { expired, pruned, pending }. The caller repeats while expired or pruned equals the
batch. With nothing pending, the tenant's "indexed" mark is cleared, so the next reserve asks
its caller to put the tenant back in the reaper's set.
A pruned reservation id is forgotten: reserving it again makes a new reservation.
]]

local now = ledger_now()
local batch, retention_ms, maxlen = ledger_int(ARGV[1]), ledger_int(ARGV[2]), ledger_int(ARGV[3])
if batch == nil or batch < 1 or retention_ms == nil then
  return { 'invalid', 'batch and retention must be integers' }
end
if maxlen == nil or maxlen < 1 then
  return { 'invalid', 'journal length must be a positive integer' }
end

local expired = ledger_expire_due(KEYS, now, batch, maxlen)
local old = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf',
  '(' .. string.format('%d', now - retention_ms), 'LIMIT', 0, batch)
if #old > 0 then
  redis.call('HDEL', KEYS[3], unpack(old))
  redis.call('ZREM', KEYS[5], unpack(old))
end
local pending = redis.call('ZCARD', KEYS[4])
if pending == 0 then
  redis.call('HDEL', KEYS[2], 'indexed')
end
return { expired, #old, pending }
