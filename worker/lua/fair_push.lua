--[[
Queue a step entry in its tenant's pending list, unless the same run's step of the same version
waits there already (the sweeper re-sending a step that is only waiting its turn); and give
back the slot of the run's step before it, whose delivery sends this one (so a continuing
run's slot changes hands in the same round trip).

KEYS
  1 pending list    turnstile:{T}:pending:<queue>:cont|start
  2 index hash      turnstile:{T}:pending-index     run id -> version waiting
  3 slots zset      turnstile:{T}:slots
ARGV
  1 run id
  2 version
  3 the entry (JSON)
  4 the slot to give back ("<run id>:<version - 1>"), or ""
Returns 1 if queued, 0 if that step was waiting already.
]]
if ARGV[4] ~= '' then
  redis.call('ZREM', KEYS[3], ARGV[4])
end
if redis.call('HGET', KEYS[2], ARGV[1]) == ARGV[2] then
  return 0
end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('RPUSH', KEYS[1], ARGV[3])
return 1
