--[[
Open, renew or close one event stream of an API key, against the key's cap on open streams.
Each stream is a member of the key's sorted set, scored by when it lapses: a server that dies
with streams open leaves members that lapse, so they stop counting without anyone cleaning up.

KEYS
  1 streams   turnstile:api:streams:<key id>
ARGV
  1 "open", "renew" or "close"
  2 the stream's id
  3 the lease (ms): how long the stream counts unless renewed
  4 the cap: streams one key may hold open ("open" only)
Returns
  {1, open streams} when opened or renewed, {0, open streams} when refused (at the cap) or,
  for "renew", when the stream had lapsed (it is counted again if there is room)
]]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[3])
if ARGV[1] == 'close' then
  redis.call('ZREM', KEYS[1], ARGV[2])
  return {1, redis.call('ZCARD', KEYS[1])}
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local open = redis.call('ZCARD', KEYS[1])
if not redis.call('ZSCORE', KEYS[1], ARGV[2]) then
  if ARGV[1] == 'renew' or open >= tonumber(ARGV[4]) then
    return {0, open}
  end
  open = open + 1
end
redis.call('ZADD', KEYS[1], now + lease, ARGV[2])
redis.call('PEXPIRE', KEYS[1], lease)
return {1, open}
