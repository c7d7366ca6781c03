--[[
shop_write: a write's second round trip (its only one when the caller remembered the order,
or took it from the 'changed' reply of its previous attempt). Python read the order (shop_read)
and applied the business rule to it; this compare-and-sets the outcome: it is written only if
(key, name) is still not stored and the order is byte for byte the one the rule saw. Only
successful writes come here; a refusal is answered from a read alone and stores nothing.

KEYS (shop S of tenant T: a tenant's shops are its own, whatever their names)
  1 orders hash    turnstile:shop:{T}:S:orders    order id -> order JSON
  2 done hash      turnstile:shop:{T}:S:done      "<key>|<name>" -> done record JSON
  3 effects list   turnstile:shop:{T}:S:effects   effect JSON, oldest first
ARGV
  1 done field "<key>|<name>"
  2 order id
  3 the order JSON the rule saw, exactly as shop_read returned it, or '' if there was none
  4 done record JSON to store: {"call": <this call's token>, "result": <result>}
  5 the order JSON after the write, or '' to leave the order as it is
  6 the effect JSON to append, or '' for none
Returns
  { 'stored' }                    written: order, effect and done record together
  { 'replay', done record JSON }  (key, name) was stored meanwhile; nothing written
  { 'changed', order JSON | nil } the order changed since it was read (or since the caller
                                  remembered it); nothing written; the order as it is now, so
                                  that the caller can apply its rule again without a read
]]
local done = redis.call('HGET', KEYS[2], ARGV[1])
if done then
  return { 'replay', done }
end
local order = redis.call('HGET', KEYS[1], ARGV[2]) or ''
if order ~= ARGV[3] then
  if order == '' then
    return { 'changed' }
  end
  return { 'changed', order }
end
if ARGV[5] ~= '' then
  redis.call('HSET', KEYS[1], ARGV[2], ARGV[5])
end
if ARGV[6] ~= '' then
  redis.call('RPUSH', KEYS[3], ARGV[6])
end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[4])
return { 'stored' }
