--[[
Take the tenant's next pending step for dispatch, if its caps have room: the step fair_lib.lua's
`fair_next` names (priority levels by effective priority, which rises as steps wait; within a
level a continuation before a new run's first step). The step takes a slot ("<run id>:<version>",
scored by when it lapses) that the step gives back when its delivery is done; a slot whose step
was lost lapses on its own (the sweeper re-sends the step). A new run's first step also needs
room under the tenant's cap on active runs (a run is active from its first dispatch until it
ends). This body follows fair_lib.lua.

KEYS
  1 continuations        turnstile:{T}:waiting:<queue>:cont
  2 first steps          turnstile:{T}:waiting:<queue>:start
  3 index hash           turnstile:{T}:waiting-index
  4 slots zset           turnstile:{T}:slots
  5 caps hash            turnstile:{T}:caps         turns_in_flight, active_runs (absent: none)
  6 active zset          turnstile:{T}:active       run id -> when its first step went (ms)
ARGV
  1 slot lease beyond the step's hard time limit (ms)
  2 priority aging (ms): a waiting step gains a level per this long
Returns
  {"empty"}                        nothing pending on this queue
  {"capped", in_flight, cap}       at its cap on turns in flight: the step stays pending
  {"capped_runs", active, cap}     only first steps wait, and the tenant is at its cap on
                                   active runs (the caller prunes runs that ended, see fair.py)
  {"ok", entry, priority}          the entry, moved out of pending into a slot, and its
                                   run's priority (the dispatcher notes it as sent with it)
]]
local now = fair_now()
local waiting = redis.call('ZCARD', KEYS[1]) + redis.call('ZCARD', KEYS[2])
if waiting == 0 then
  return {'empty'}
end
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
local caps = redis.call('HMGET', KEYS[5], 'turns_in_flight', 'active_runs')
local cap, runs_cap = tonumber(caps[1] or ''), tonumber(caps[2] or '')
local in_flight = redis.call('ZCARD', KEYS[4])
if cap and in_flight >= cap then
  return {'capped', in_flight, cap}
end
local starts, active = true, 0
if runs_cap then
  active = redis.call('ZCARD', KEYS[6])
  starts = active < runs_cap
end
local set, entry, priority = fair_next(KEYS[1], KEYS[2], starts, tonumber(ARGV[2]))
if not entry then
  return {'capped_runs', active, runs_cap}
end
redis.call('ZREM', set, entry)
local step = cjson.decode(entry)
local run_id, version = step.run_id, tostring(step.version)
if redis.call('HGET', KEYS[3], run_id) == version then
  redis.call('HDEL', KEYS[3], run_id)
end
if version == '1' then
  redis.call('ZADD', KEYS[6], 'NX', now, run_id)
end
local lease = tonumber(ARGV[1]) + math.floor((tonumber(step.hard_s) or 0) * 1000)
redis.call('ZADD', KEYS[4], now + lease, run_id .. ':' .. version)
return {'ok', entry, priority}
