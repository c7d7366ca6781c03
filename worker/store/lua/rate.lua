--[[
Count one submission against a key's fixed window; refuse it when the window is full.

KEYS
  1 counter   turnstile:api:rate:<key id>:<window number>
ARGV
  1 the limit: submissions per window
  2 the window's length (s), the counter's time to live
Returns
  {1, count, ttl_s} when admitted, {0, count, ttl_s} when refused (the refused one not counted)
]]
local limit = tonumber(ARGV[1])
local count = tonumber(redis.call('GET', KEYS[1]) or '0')
if count >= limit then
  return {0, count, redis.call('TTL', KEYS[1])}
end
count = redis.call('INCR', KEYS[1])
if count == 1 then
  redis.call('EXPIRE', KEYS[1], tonumber(ARGV[2]))
end
return {1, count, redis.call('TTL', KEYS[1])}
