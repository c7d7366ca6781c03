--[[
Create a run, once. Idempotent on the run id: a second create with the same fingerprint is a
no-op that says so; with another fingerprint it is refused and nothing changes.

KEYS
  1 run hash        turnstile:{T}:run:<id>
  2 events stream   turnstile:{T}:events:<id>
  3 runs zset       turnstile:{T}:runs           run id -> created (ms)
  4 status set      turnstile:{T}:status:running
  5 leases zset     turnstile:{T}:leases         run id -> when its lease lapses (ms)
ARGV
  1 run id
  2 state JSON (schema-versioned, from the kernel)
  3 fingerprint of the submission (tenant, user, job, goal, params, budget, queue)
  4 queue
  5 job
  6 user id
  7 pickup lease (ms): how long the first step has to start before the sweeper re-sends it
  8 the "submitted" event, JSON
  9 events stream max length
  10 the first turn's ledger hold, JSON (see run_load.lua)
  11 the run's priority (0-9; fair share takes a tenant's higher ones first, see fair_lib.lua)
Returns
  {"created", now_ms} or {"exists", fingerprint}
]]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local existing = redis.call('HGET', KEYS[1], 'fingerprint')
if existing then
  return {'exists', existing}
end
redis.call('HSET', KEYS[1],
  'state', ARGV[2], 'version', 1, 'status', 'running', 'fingerprint', ARGV[3],
  'queue', ARGV[4], 'job', ARGV[5], 'user', ARGV[6],
  'created_ms', string.format('%d', now), 'updated_ms', string.format('%d', now),
  'hold', ARGV[10], 'priority', ARGV[11])
redis.call('ZADD', KEYS[3], now, ARGV[1])
redis.call('SADD', KEYS[4], ARGV[1])
redis.call('ZADD', KEYS[5], now + tonumber(ARGV[7]), ARGV[1])
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[9], '*', 'event', ARGV[8])
return {'created', string.format('%d', now)}
