--[[
Renew the in-flight lease of a turn that is still running (the step's heartbeat).

KEYS
  1 leases zset     turnstile:{T}:leases
  2 inflight hash   turnstile:{T}:inflight
ARGV
  1 run id
  2 "<queue>|<pid>|<host>" of the turn (its mark goes on with the delivery's token)
  3 lease (ms) from now
Returns 1 if renewed, 0 if the turn is no longer in flight here (it committed, or another
delivery took over after this one's lease lapsed).
]]
local running = redis.call('HGET', KEYS[2], ARGV[1])
if not running or string.sub(running, 1, #ARGV[2] + 1) ~= ARGV[2] .. '|' then
  return 0
end
local t = redis.call('TIME')
local until_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[3])
redis.call('ZADD', KEYS[1], 'XX', until_ms, ARGV[1])
local head = string.match(running, '^(.*)|%d+$') or ARGV[2]
redis.call('HSET', KEYS[2], ARGV[1], head .. '|' .. string.format('%d', until_ms))
return 1
