--[[
Take the tenant's steps whose rate-limit wait is over out of its deferred set, for the
dispatcher to queue in their pending lists (fair_push.lua, which folds a step queued already).

KEYS
  1 deferred zset   turnstile:{T}:deferred    entry -> when it may go (ms)
ARGV
  1 at most this many
Returns {entries due (JSON)..., then the ms until the next one is due, or -1 if none waits}
]]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
if #due > 0 then
  redis.call('ZREM', KEYS[1], unpack(due))
end
local next_one = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if next_one[2] then
  due[#due + 1] = math.max(0, tonumber(next_one[2]) - now)
else
  due[#due + 1] = -1
end
return due
