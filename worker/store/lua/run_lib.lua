--[[
The load of a run for one step (see run_load.lua, which documents its keys, arguments and
reply), as a function: run_load.lua calls it for a delivered step, and run_commit.lua for the
step an eager commit claims, so a claimed step is gated, counted and admitted exactly as a
delivered one. This body follows the ledger's library (`ledger_reserve_at`).

  K        the keys of run_load.lua, in its order (run, leases, control, inflight, six ledger
           keys, the run's live readers)
  A        its arguments, in its order (run id, version, in-flight lease, where, token, after)
  given    what the caller (run_commit.lua's claim) knows already, or nil: `now`, the
           script's time (ms); `expired`, the ledger's due expiries are charged at `now` (see
           ledger/lib.lua); `paused`, the tenant's pause flag as read; `idle`, no turn of the
           run is in flight (the caller just cleared it)
]]
local function run_load_at(K, A, given)
  given = given or {}
  local fields = redis.call('HMGET', K[1], 'version', 'status', 'state', 'attempt_version',
    'attempt_tokens', 'cancel_by', 'cancel_reason', 'hold', 'holds', 'updated_ms', 'supersede_by',
    'followups')
  local version, status = fields[1], fields[2]
  if not version then
    return {'missing'}
  end
  if version ~= A[2] then
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
  local after = A[6]
  if after ~= '' then
    -- The earlier delivery exited cleanly: it no longer counts.
    for j = #tokens, 1, -1 do
      if tokens[j] == after then
        table.remove(tokens, j)
        break
      end
    end
    redis.call('HSET', K[1], 'attempt_tokens', table.concat(tokens, ' '))
  end
  local now = given.now
  if not now then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  local running = not given.idle and redis.call('HGET', K[4], A[1])
  if running then
    local token, lease = string.match(running, '|([^|]*)|(%d+)$')
    if tonumber(lease or '0') > now and (after == '' or token ~= after) then
      return {'busy', version, status}
    end
  end
  tokens[#tokens + 1] = A[5]
  local attempts = #tokens
  redis.call('HSET', K[1], 'attempt_version', version, 'attempt_tokens',
    table.concat(tokens, ' '), 'attempts', attempts, 'loaded_ms', string.format('%d', now))
  local lease_until = now + tonumber(A[3])
  redis.call('ZADD', K[2], lease_until, A[1])
  redis.call('HSET', K[4], A[1], A[4] .. '|' .. A[5] .. '|'
    .. string.format('%d', lease_until))
  local paused = given.paused or redis.call('HGET', K[3], 'paused') or ''
  local cancel_by = fields[6] or ''
  local supersede_by = fields[11] or ''

  local hold, reply, hold_id = 'none', '', ''
  if paused ~= '' or cancel_by ~= '' or supersede_by ~= '' then
    hold = 'skipped'
  elseif fields[8] then
    local stored = cjson.decode(fields[8])
    if stored.unfit then
      hold, reply = 'unfit', stored.unfit
    else
      reply = ledger_reserve_at({K[5], K[6], K[7], K[8], K[9], K[10]}, stored.argv, now,
        given.expired)
      hold, hold_id = reply[1], stored.argv[1]
      if hold == 'admitted' then
        local open = fields[9] or ''
        if not string.find(' ' .. open .. ' ', ' ' .. hold_id .. ' ', 1, true) then
          redis.call('HSET', K[1], 'holds', open == '' and hold_id or open .. ' ' .. hold_id)
        end
      end
    end
  end
  -- The gap since the run last changed: for a continuing run, from its commit to this start.
  local gap = now - (tonumber(fields[10] or '') or now)
  -- Whether someone reads the run's live output now: the turn then writes its words as they
  -- come (worker/store/live.py); told here so that a turn asks nothing more of the store.
  local watched = redis.call('EXISTS', K[11]) == 1 and '1' or ''
  return {'go', fields[3], attempts, paused, cancel_by, fields[7] or '', status, hold, reply, hold_id,
    gap, supersede_by, fields[12] or '', watched}
end
