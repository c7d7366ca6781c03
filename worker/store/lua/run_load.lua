--[[
Load a run for one step, gate it and admit it, in one round trip: its state, if the step's
version is current and the run is live; the attempt count (a step that keeps killing its
worker is poison: see below); the in-flight lease and mark; the tenant's pause flag and any cancel
request; and, when the run may go on, the ledger hold for its next turn, taken here with
`ledger_reserve` (this body follows the ledger's library, see ledger/lib.lua).

The hold's arguments were computed when the run last changed (field `hold`: JSON, either
{"argv": ledger_reserve's argv, "exposure": {...}} or {"unfit": dimension} when the run's own
budget does not admit another turn). Nothing is reserved for a run that is paused, cancelled
or unfit. A queue's flags are not in this slot: the caller reads them in the same pipeline and
releases the hold if the queue turns out to be paused or draining. The id of a hold taken is
added to the run's open holds (field `holds`, ids separated by spaces): the next commit settles
or releases every one of them (see run_commit.lua).

Attempts count the deliveries of this version that started a turn and may have died in it:
field `attempt_tokens` lists their delivery tokens. A delivery that exited cleanly (the store
or the ledger was down: it could not say so then) is named by its retry as `after`; that entry
is dropped, and its in-flight mark does not make the retry wait. Only deliveries that died
mid-turn are left counted.

KEYS
  1 run hash        turnstile:{T}:run:<id>
  2 leases zset     turnstile:{T}:leases
  3 control hash    turnstile:{T}:control       tenant flags
  4 inflight hash   turnstile:{T}:inflight      run id -> "<queue>|<pid>|<host>|<token>|<lease ms>"
  5-10              the tenant's six ledger keys, in the library's order
ARGV
  1 run id
  2 version the step expects
  3 in-flight lease (ms)
  4 "<queue>|<pid>|<host>": where the turn runs (a drain waits for its queue's turns)
  5 this delivery's token (no spaces, no '|')
  6 the token of the earlier delivery of this step that exited cleanly, or ""
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
  'attempt_tokens', 'cancel_by', 'cancel_reason', 'hold', 'holds')
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
local tokens = {}
if fields[4] == version then
  for token in string.gmatch(fields[5] or '', '%S+') do
    tokens[#tokens + 1] = token
  end
end
local after = ARGV[6]
if after ~= '' then
  -- The earlier delivery exited cleanly: it no longer counts.
  for j = #tokens, 1, -1 do
    if tokens[j] == after then
      table.remove(tokens, j)
      break
    end
  end
  redis.call('HSET', KEYS[1], 'attempt_tokens', table.concat(tokens, ' '))
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local running = redis.call('HGET', KEYS[4], ARGV[1])
if running then
  local token, lease = string.match(running, '|([^|]*)|(%d+)$')
  if tonumber(lease or '0') > now and (after == '' or token ~= after) then
    return {'busy', version, status}
  end
end
tokens[#tokens + 1] = ARGV[5]
local attempts = #tokens
redis.call('HSET', KEYS[1], 'attempt_version', version, 'attempt_tokens',
  table.concat(tokens, ' '), 'attempts', attempts, 'loaded_ms', string.format('%d', now))
local lease_until = now + tonumber(ARGV[3])
redis.call('ZADD', KEYS[2], lease_until, ARGV[1])
redis.call('HSET', KEYS[4], ARGV[1], ARGV[4] .. '|' .. ARGV[5] .. '|'
  .. string.format('%d', lease_until))
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
    if hold == 'admitted' then
      local open = fields[9] or ''
      if not string.find(' ' .. open .. ' ', ' ' .. hold_id .. ' ', 1, true) then
        redis.call('HSET', KEYS[1], 'holds', open == '' and hold_id or open .. ' ' .. hold_id)
      end
    end
  end
end
return {'go', fields[3], attempts, paused, cancel_by, fields[7] or '', status, hold, reply, hold_id}
