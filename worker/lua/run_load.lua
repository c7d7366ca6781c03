--[[
Load a run for one step: its state, if the step's version is current and the run is live.
Counts the attempt (a step that keeps killing its worker is poison), takes the in-flight lease
and marks the turn in flight. Also returns the tenant's pause flag and any cancel request, so
the gate costs no extra round trip.

KEYS
  1 run hash        turnstile:{T}:run:<id>
  2 leases zset     turnstile:{T}:leases
  3 control hash    turnstile:{T}:control       tenant flags
  4 inflight hash   turnstile:{T}:inflight      run id -> "<queue>|<pid>|<host>"
ARGV
  1 run id
  2 version the step expects
  3 in-flight lease (ms)
  4 "<queue>|<pid>|<host>": where the turn runs (a drain waits for its queue's turns)
Returns
  {"missing"}
  {"stale", version, status}                  another step already moved the run on
  {"idle", version, status}                   suspended, parked or stopped: nothing to run
  {"go", state, attempts, tenant_paused, cancel_by, cancel_reason, status}
]]
local fields = redis.call('HMGET', KEYS[1], 'version', 'status', 'state', 'attempt_version',
  'attempts', 'cancel_by', 'cancel_reason')
local version, status = fields[1], fields[2]
if not version then
  return {'missing'}
end
if version ~= ARGV[2] then
  return {'stale', version, status or ''}
end
if status ~= 'running' then
  return {'idle', version, status or ''}
end
local attempts = 1
if fields[4] == version then
  attempts = tonumber(fields[5] or '0') + 1
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], 'attempt_version', version, 'attempts', attempts)
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), ARGV[1])
redis.call('HSET', KEYS[4], ARGV[1], ARGV[4])
local paused = redis.call('HGET', KEYS[3], 'paused') or ''
return {'go', fields[3], attempts, paused, fields[6] or '', fields[7] or '', status}
