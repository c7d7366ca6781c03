--[[
Fair share's one write to a tenant's pending list, shared by fair_push.lua (a step sent by a
client, the sweeper or resume) and run_commit.lua (the next step of a run, queued by the very
commit that makes it due, so no crash can fall between the two).

Queue a step entry in its tenant's pending list, unless the same run's step of the same
version waits there already (the sweeper re-sending a step that is only waiting its turn); and
give back the slot of the run's step before it, whose delivery sends this one (so a continuing
run's slot changes hands in the same round trip). All three keys are in the tenant's slot.

  pending   turnstile:{T}:pending:<queue>:cont|start
  index     turnstile:{T}:pending-index     run id -> version waiting
  slots     turnstile:{T}:slots
  before    the slot to give back ("<run id>:<version - 1>"), or ""
Returns 1 if queued, 0 if that step was waiting already.
]]
local function fair_queue(pending, index, slots, run_id, version, entry, before)
  if before ~= '' then
    redis.call('ZREM', slots, before)
  end
  if redis.call('HGET', index, run_id) == version then
    return 0
  end
  redis.call('HSET', index, run_id, version)
  redis.call('RPUSH', pending, entry)
  return 1
end
