--[[
Load a run for one step, gate it and admit it, in one round trip: its state, if the step's
version is current and the run is live; the attempt count (a step that keeps killing its
worker is poison); the in-flight lease and mark; the tenant's pause flag and any cancel
request; and, when the run may go on, the ledger hold for its next turn, taken here with
`ledger_reserve` (this body follows the ledger's library, see ledger/lib.lua).

The hold's arguments were computed when the run last changed (field `hold`: JSON, either
{"argv": ledger_reserve's argv, "exposure": {...}} or {"unfit": dimension} when the run's own
budget does not admit another turn). Nothing is reserved for a run that is paused, cancelled
or unfit. A queue's flags are not in this slot: the caller reads them in the same pipeline and
releases the hold if the queue turns out to be paused or draining.

KEYS
  1 run hash        turnstile:{T}:run:<id>
  2 leases zset     turnstile:{T}:leases
  3 control hash    turnstile:{T}:control       tenant flags
  4 inflight hash   turnstile:{T}:inflight      run id -> "<queue>|<pid>|<host>|<lease ms>"
  5-10              the tenant's six ledger keys, in the library's order
ARGV
  1 run id
  2 version the step expects
  3 in-flight lease (ms)
  4 "<queue>|<pid>|<host>": where the turn runs (a drain waits for its queue's turns)
Returns
  {"missing"}
  {"stale", version, status}                  another step already moved the run on
  {"idle", version, status}                   suspended, parked or stopped: nothing to run
  {"busy", version, status}                   another delivery of this step is running it
                                              (its in-flight lease is live): one turn per
                                              version, so a duplicate never forks the run
  {"go", state, attempts, tenant_paused, cancel_by, cancel_reason, status, hold, reply, hold_id}
      hold   "admitted" | "rejected" | "conflict" | "unfit" | "none" (no hold stored) |
             "skipped" (paused or cancelled: nothing reserved)
      reply  ledger_reserve's reply when it was called, else the unfit dimension or ""
      hold_id  the reservation id when ledger_reserve was called, else ""
]]
local fields = redis.call('HMGET', KEYS[1], 'version', 'status', 'state', 'attempt_version',
  'attempts', 'cancel_by', 'cancel_reason', 'hold')
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
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local running = redis.call('HGET', KEYS[4], ARGV[1])
if running then
  local lease = tonumber(string.match(running, '|(%d+)$') or '0')
  if lease > now then
    return {'busy', version, status}
  end
end
local attempts = 1
if fields[4] == version then
  attempts = tonumber(fields[5] or '0') + 1
end
redis.call('HSET', KEYS[1], 'attempt_version', version, 'attempts', attempts)
local lease_until = now + tonumber(ARGV[3])
redis.call('ZADD', KEYS[2], lease_until, ARGV[1])
redis.call('HSET', KEYS[4], ARGV[1], ARGV[4] .. '|' .. string.format('%d', lease_until))
local paused = redis.call('HGET', KEYS[3], 'paused') or ''
local cancel_by = fields[6] or ''

local hold, reply, hold_id = 'none', '', ''
if paused ~= '' or cancel_by ~= '' then
  hold = 'skipped'
elseif fields[8] then
  local stored = cjson.decode(fields[8])
  if stored.unfit then
    hold, reply = 'unfit', stored.unfit
  else
    reply = ledger_reserve({KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10]}, stored.argv)
    hold, hold_id = reply[1], stored.argv[1]
  end
end
return {'go', fields[3], attempts, paused, cancel_by, fields[7] or '', status, hold, reply, hold_id}
