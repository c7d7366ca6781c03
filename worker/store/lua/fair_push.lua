--[[
Queue a step in its tenant's pending set (this body follows fair_lib.lua: see fair_queue).

KEYS
  1 pending set     turnstile:{T}:waiting:<queue>:cont|start
  2 index hash      turnstile:{T}:waiting-index    run id -> version waiting
  3 slots zset      turnstile:{T}:slots
  4 run hash        turnstile:{T}:run:<id>         its priority
ARGV
  1 run id
  2 version
  3 the entry (JSON)
  4 the slot to give back ("<run id>:<version - 1>"), or ""
Returns 1 if queued, 0 if that step was waiting already.
]]
return fair_queue(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[1], ARGV[2], ARGV[3], ARGV[4])
