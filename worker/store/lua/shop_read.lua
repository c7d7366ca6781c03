--[[
shop_read: a write's first round trip, and every read of the demo shop. Seeds the shop with
its demo orders the first time it is touched (HSETNX each, so concurrent first touches agree),
then returns what the caller asked for, as one consistent snapshot.

KEYS (shop S of tenant T: a tenant's shops are its own, whatever their names)
  1 orders hash    turnstile:shop:{T}:S:orders    order id -> order JSON
  2 done hash      turnstile:shop:{T}:S:done      "<key>|<name>" -> done record JSON
ARGV
  1 done field "<key>|<name>" to look up, or '' to look up none
  2 '1' to return every order, '0' to return only the order named by ARGV[3]
  3 order id (ignored when ARGV[2] is '1')
  4.. demo orders to seed: order id, order JSON, order id, order JSON, ...
Returns
  { done record JSON | nil, { order id, order JSON, ... } }
      when the done record is there the order list is empty: a replay needs nothing else;
      a missing order is simply absent from the list
]]
for i = 4, #ARGV, 2 do
  redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1])
end
local done = false
if ARGV[1] ~= '' then
  done = redis.call('HGET', KEYS[2], ARGV[1])
end
if done then
  return { done, {} }
end
if ARGV[2] == '1' then
  return { false, redis.call('HGETALL', KEYS[1]) }
end
local order = redis.call('HGET', KEYS[1], ARGV[3])
if order then
  return { false, { ARGV[3], order } }
end
return { false, {} }
