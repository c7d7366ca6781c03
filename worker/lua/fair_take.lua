--[[
Take the tenant's next pending step for dispatch, if its cap on turns in flight has room: a
continuation before a new run's first step. The step takes a slot ("<run id>:<version>",
scored by when it lapses) that the step gives back when its delivery is done; a slot whose
step was lost lapses on its own (the sweeper re-sends the step).

KEYS
  1 continuations list   turnstile:{T}:pending:<queue>:cont
  2 starts list          turnstile:{T}:pending:<queue>:start
  3 index hash           turnstile:{T}:pending-index
  4 slots zset           turnstile:{T}:slots
  5 caps hash            turnstile:{T}:caps         turns_in_flight (absent: no cap)
ARGV
  1 slot lease beyond the step's hard time limit (ms)
Returns
  {"empty"}                   nothing pending on this queue
  {"capped", in_flight, cap}  at its cap: the step stays pending
  {"ok", entry}               the entry, moved out of pending into a slot
]]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
local cap = tonumber(redis.call('HGET', KEYS[5], 'turns_in_flight') or '')
local in_flight = redis.call('ZCARD', KEYS[4])
if cap and in_flight >= cap then
  if redis.call('LLEN', KEYS[1]) + redis.call('LLEN', KEYS[2]) == 0 then
    return {'empty'}
  end
  return {'capped', in_flight, cap}
end
local entry = redis.call('LPOP', KEYS[1])
if not entry then
  entry = redis.call('LPOP', KEYS[2])
end
if not entry then
  return {'empty'}
end
local step = cjson.decode(entry)
local run_id, version = step.run_id, tostring(step.version)
if redis.call('HGET', KEYS[3], run_id) == version then
  redis.call('HDEL', KEYS[3], run_id)
end
local lease = tonumber(ARGV[1]) + math.floor((tonumber(step.hard_s) or 0) * 1000)
redis.call('ZADD', KEYS[4], now + lease, run_id .. ':' .. version)
return {'ok', entry}
