--[[
Turnstile ledger: the shared Lua library.

Every ledger script is this file followed by one operation file (reserve.lua, settle.lua, ...).
Everything here is a `local`, so a script that embeds the library sees these names and nothing
leaks into the server's global table.

KEYS (every function here that touches data takes them as a table `keys`, in this order; all
six carry the tenant's hash tag, so one script stays in one cluster slot; build them with
`ledger.keys.tenant_keys(tenant)`):
  keys[1] limits     hash    dimension -> "<ceiling or ->|<1 hard, 0 soft>|<none|day|month>"
  keys[2] usage      hash    "c:<dimension>:<bucket>" committed, "r:<dimension>:<bucket>"
                             reserved, "indexed" -> 1 while the tenant is in the reaper's set
  keys[3] records    hash    "r:<reservation id>" -> reservation record (see ledger_decode),
                             "o:<operation id>" -> fingerprint of a set_ceiling call
  keys[4] deadlines  zset    reservation id scored by deadline (ms); pending reservations only
  keys[5] resolved   zset    "r:<id>" / "o:<id>" scored by when it was resolved (ms); pruned
                             by the reaper after the retention period
  keys[6] journal    stream  one entry per change: op, id, at_ms, changes, and per op extras;
                             changes is "<dim>@<bucket>:<committed delta>:<reserved delta>;..."

Time is the server's `TIME`, read once per script by the operation file and passed down as
`now` (milliseconds). Buckets: a dimension's period is "none" (bucket "all"), "day" (bucket
"YYYY-MM-DD", UTC) or "month" ("YYYY-MM", UTC). A reservation belongs, for good, to the bucket
of each dimension at the moment it was admitted; its settlement and expiry are booked there.

Every function validates its whole input before its first write; a refusal writes nothing.
(Processing of due expiries happens after validation and is a complete change of its own.)

EMBEDDING RESERVE (the worker's load script)
--------------------------------------------
  local res = ledger_reserve(keys, argv)

  keys  the six ledger keys, as below
  argv  exactly as `Ledger.reserve_script_args` returns it: { reservation_id, timeout_ms,
        grace_ms, journal_maxlen, dim_1, amount_1, ... }
  res   reserve.lua's reply (see the top of reserve.lua); a refusal writes nothing, and
        'admitted' with newly_indexed 1 asks the caller to add the tenant to the reaper's set

EMBEDDING SETTLE (the worker's commit script)
---------------------------------------------
Compose the script as `ledger.scripts.library_source()` followed by your own code, and call

  local res = ledger_settle(keys, argv)

  keys  the six ledger keys above, in that order (`Ledger.settle_script_args` returns them)
  argv  { reservation_id, journal_maxlen, dim_1, amount_1, dim_2, amount_2, ... }
        every entry a string, exactly as `Ledger.settle_script_args` returns them; amounts are
        the actual usage, decimal integers 0..2^53; a dimension not named spent 0

  res   a Lua table, one of
    { 'settled', replayed, overage, corrected }
        replayed   1 if this exact settlement was already applied (nothing written), else 0
        overage    flat list { dim, amount, ... } of actual above the reserved amount
        corrected  1 if the reservation had expired and been charged in full, now corrected
    { 'conflict' }          already settled or released with a different actual: nothing written
    { 'unknown' }           no such reservation (never made, or pruned after retention)
    { 'invalid', message }  bad input: nothing written

Call it before your own writes and abort on anything but 'settled'; it never raises for a
refusal. It calls TIME itself, which is allowed because scripts replicate their effects.

To settle several reservations in one script all or nothing, first call

  local refusal = ledger_settle_check(keys, argv)

for each of them: it writes nothing and returns nil when ledger_settle would answer 'settled'
(applied or replayed), else the refusal ledger_settle would return. Then settle each in turn.
(Two settlements of the same reservation id in one script are not checked against each other.)
]]

-- 2^53: Lua numbers are doubles, exact up to here. Amounts, ceilings and totals stay below.
local LEDGER_MAX_AMOUNT = 9007199254740992
-- Due expiries charged per operation; the reaper charges any backlog.
local LEDGER_EXPIRE_BATCH = 16
local LEDGER_UNLIMITED = '-|1|none'

-- Numbers go into strings through "%d" only: concatenation would print 2^53 as 9.007e+15.
local function ledger_fmt(n)
  return string.format('%d', n)
end

local function ledger_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- A decimal integer string in 0..2^53, as a number; nil for anything else.
local function ledger_int(s)
  if type(s) ~= 'string' or #s == 0 or #s > 16 or not string.find(s, '^%d+$') then
    return nil
  end
  local n = tonumber(s)
  if n > LEDGER_MAX_AMOUNT then
    return nil
  end
  return n
end

local function ledger_valid_id(id)
  return type(id) == 'string' and #id > 0 and #id <= 256 and not string.find(id, '[%c%s]')
end

-- argv[first], argv[first + 1], ... as dimension/amount pairs.
-- Returns dims (in the given order), amounts (dim -> number); or nil, nil, message.
local function ledger_parse_pairs(argv, first)
  local dims, amounts = {}, {}
  local n = #argv
  if (n - first + 1) % 2 ~= 0 then
    return nil, nil, 'dimension and amount arguments must come in pairs'
  end
  for i = first, n, 2 do
    local d = argv[i]
    if type(d) ~= 'string' or #d > 64 or not string.find(d, '^[a-z][a-z0-9_]*$') then
      return nil, nil, 'bad dimension name: ' .. tostring(d)
    end
    if amounts[d] ~= nil then
      return nil, nil, 'dimension named twice: ' .. d
    end
    local amount = ledger_int(argv[i + 1])
    if amount == nil then
      return nil, nil, 'amount of ' .. d .. ' must be an integer in 0..2^53'
    end
    dims[#dims + 1] = d
    amounts[d] = amount
  end
  return dims, amounts
end

-- The period bucket that `ms` (UTC, since the epoch) falls in.
-- Civil date from a day count: H. Hinnant's days_from_civil, run backwards.
local function ledger_bucket(period, ms)
  if period == 'none' then
    return 'all'
  end
  local z = math.floor(ms / 86400000) + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524)
    - math.floor(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local day = doy - math.floor((153 * mp + 2) / 5) + 1
  local month = mp < 10 and mp + 3 or mp - 9
  local year = yoe + era * 400 + (month <= 2 and 1 or 0)
  if period == 'day' then
    return string.format('%04d-%02d-%02d', year, month, day)
  end
  return string.format('%04d-%02d', year, month)
end

-- A limits entry as ceiling (nil: unlimited), hard (boolean), period.
-- A dimension never configured is unlimited and counted under period "none".
local function ledger_parse_limit(raw)
  if not raw then
    return nil, true, 'none'
  end
  local c, h, p = string.match(raw, '^([^|]*)|([01])|(%a+)$')
  return tonumber(c), h == '1', p
end

-- A reservation record: "<state>|<deadline>|<created>|<soft>|<amounts>|<actual>"
--   state    P pending, X expired (charged in full, unsettled), S settled, R released
--   soft     "dim,..." soft dimensions the reservation took past their ceiling
--   amounts  "dim:bucket:n,..." in the order reserved
--   actual   "dim:bucket:n,..." the settled actual usage, zeros left out
local function ledger_decode(raw)
  local state, deadline, created, soft, amounts, actual =
    string.match(raw, '^(%u)|(%d+)|(%d+)|([^|]*)|([^|]*)|([^|]*)$')
  local rec = {
    state = state, deadline = tonumber(deadline), created = tonumber(created),
    soft_text = soft, amounts_text = amounts,
    dims = {}, amount = {}, bucket = {}, actual = {},
  }
  for d, b, n in string.gmatch(amounts, '([%w_]+):([%w-]+):(%d+)') do
    rec.dims[#rec.dims + 1] = d
    rec.amount[d] = tonumber(n)
    rec.bucket[d] = b
  end
  for d, _, n in string.gmatch(actual, '([%w_]+):([%w-]+):(%d+)') do
    rec.actual[d] = tonumber(n)
  end
  return rec
end

local function ledger_soft_list(soft_text)
  local soft = {}
  for d in string.gmatch(soft_text, '[%w_]+') do
    soft[#soft + 1] = d
  end
  return soft
end

-- Read, adjust and write back usage fields in two calls. `fields` lists field names, `delta`
-- maps each to the change to make.
local function ledger_adjust(usage_key, fields, delta)
  local values = redis.call('HMGET', usage_key, unpack(fields))
  local args = {}
  for i, f in ipairs(fields) do
    args[2 * i - 1] = f
    args[2 * i] = ledger_fmt((tonumber(values[i]) or 0) + delta[f])
  end
  redis.call('HSET', usage_key, unpack(args))
end

local function ledger_journal(keys, maxlen, now, op, id, changes, extra)
  if extra then
    redis.call('XADD', keys[6], 'MAXLEN', '~', maxlen, '*', 'op', op, 'id', id,
      'at_ms', ledger_fmt(now), 'changes', changes, unpack(extra))
  else
    redis.call('XADD', keys[6], 'MAXLEN', '~', maxlen, '*', 'op', op, 'id', id,
      'at_ms', ledger_fmt(now), 'changes', changes)
  end
end

-- Charge in full every pending reservation whose deadline is before `now`, oldest deadline
-- first, at most `limit` of them. Returns how many were charged.
local function ledger_expire_due(keys, now, limit, maxlen)
  local due = redis.call('ZRANGEBYSCORE', keys[4], '-inf', '(' .. ledger_fmt(now),
    'LIMIT', 0, limit)
  for _, id in ipairs(due) do
    local raw = redis.call('HGET', keys[3], 'r:' .. id)
    if raw and string.sub(raw, 1, 1) == 'P' then
      local rec = ledger_decode(raw)
      local fields, delta, changes = {}, {}, {}
      for i, d in ipairs(rec.dims) do
        local b, amount = rec.bucket[d], rec.amount[d]
        local c, r = 'c:' .. d .. ':' .. b, 'r:' .. d .. ':' .. b
        fields[2 * i - 1], fields[2 * i] = c, r
        delta[c], delta[r] = amount, -amount
        changes[i] = d .. '@' .. b .. ':' .. ledger_fmt(amount) .. ':' .. ledger_fmt(-amount)
      end
      ledger_adjust(keys[2], fields, delta)
      redis.call('HSET', keys[3], 'r:' .. id, 'X' .. string.sub(raw, 2))
      redis.call('ZADD', keys[5], now, 'r:' .. id)
      ledger_journal(keys, maxlen, now, 'expire', id, table.concat(changes, ';'),
        { 'deadline_ms', ledger_fmt(rec.deadline) })
    end
    redis.call('ZREM', keys[4], id)
  end
  return #due
end

-- Reserve at time `now`: the body of reserve.lua, so that another script can take a hold in
-- the same atomic step as its own reads (the worker's load script does). keys and argv as in
-- reserve.lua; the reply is reserve.lua's.
local function ledger_reserve_at(keys, argv, now)
  local id = argv[1]
  if not ledger_valid_id(id) then
    return { 'invalid', 'reservation id must be 1..256 characters with no spaces' }
  end
  local timeout_ms, grace_ms, maxlen = ledger_int(argv[2]), ledger_int(argv[3]), ledger_int(argv[4])
  if timeout_ms == nil or grace_ms == nil then
    return { 'invalid', 'timeout and grace must be integers of milliseconds' }
  end
  if maxlen == nil or maxlen < 1 then
    return { 'invalid', 'journal length must be a positive integer' }
  end
  local dims, amounts, err = ledger_parse_pairs(argv, 5)
  if err then
    return { 'invalid', err }
  end
  if #dims == 0 then
    return { 'invalid', 'nothing to reserve' }
  end

  ledger_expire_due(keys, now, LEDGER_EXPIRE_BATCH, maxlen)

  local record_field = 'r:' .. id
  local existing = redis.call('HGET', keys[3], record_field)
  if existing then
    local rec = ledger_decode(existing)
    local same = #rec.dims == #dims
    for _, d in ipairs(dims) do
      same = same and rec.amount[d] == amounts[d]
    end
    if not same then
      return { 'conflict' }
    end
    return { 'admitted', rec.deadline, 1, ledger_soft_list(rec.soft_text), 0 }
  end

  -- Usage fields: committed and reserved of each dimension in its current bucket, then the
  -- tenant's "indexed" mark.
  local limits = redis.call('HMGET', keys[1], unpack(dims))
  local bucket, ceiling, hard, fields = {}, {}, {}, {}
  for i, d in ipairs(dims) do
    local c, h, p = ledger_parse_limit(limits[i])
    ceiling[d], hard[d] = c, h
    bucket[d] = ledger_bucket(p, now)
    fields[2 * i - 1] = 'c:' .. d .. ':' .. bucket[d]
    fields[2 * i] = 'r:' .. d .. ':' .. bucket[d]
  end
  fields[#fields + 1] = 'indexed'
  local values = redis.call('HMGET', keys[2], unpack(fields))

  local rejected, soft = {}, {}
  for i, d in ipairs(dims) do
    local reserved = tonumber(values[2 * i]) or 0
    local used = (tonumber(values[2 * i - 1]) or 0) + reserved
    -- Subtract rather than add: used + amount would round to 2^53 where it passes it by one.
    if used > LEDGER_MAX_AMOUNT or amounts[d] > LEDGER_MAX_AMOUNT - used then
      return { 'invalid', 'total of ' .. d .. ' would pass 2^53' }
    end
    local cap = ceiling[d]
    if cap ~= nil and used + amounts[d] > cap then
      if hard[d] then
        rejected[#rejected + 1] = d
        rejected[#rejected + 1] = amounts[d]
        rejected[#rejected + 1] = math.max(0, cap - used)
      else
        soft[#soft + 1] = d
      end
    end
  end
  if #rejected > 0 then
    return { 'rejected', rejected, soft }
  end

  local deadline = now + timeout_ms + grace_ms
  local writes, parts, changes = {}, {}, {}
  for i, d in ipairs(dims) do
    local amount = ledger_fmt(amounts[d])
    writes[2 * i - 1] = fields[2 * i]
    writes[2 * i] = ledger_fmt((tonumber(values[2 * i]) or 0) + amounts[d])
    parts[i] = d .. ':' .. bucket[d] .. ':' .. amount
    changes[i] = d .. '@' .. bucket[d] .. ':0:' .. amount
    if not limits[i] then
      redis.call('HSET', keys[1], d, LEDGER_UNLIMITED)
    end
  end
  local newly_indexed = values[#fields] and 0 or 1
  if newly_indexed == 1 then
    writes[#writes + 1] = 'indexed'
    writes[#writes + 1] = '1'
  end
  redis.call('HSET', keys[2], unpack(writes))
  redis.call('HSET', keys[3], record_field, 'P|' .. ledger_fmt(deadline) .. '|' .. ledger_fmt(now)
    .. '|' .. table.concat(soft, ',') .. '|' .. table.concat(parts, ',') .. '|')
  redis.call('ZADD', keys[4], deadline, id)
  ledger_journal(keys, maxlen, now, 'reserve', id, table.concat(changes, ';'),
    { 'deadline_ms', ledger_fmt(deadline) })
  return { 'admitted', deadline, 0, soft, newly_indexed }
end

local function ledger_reserve(keys, argv)
  return ledger_reserve_at(keys, argv, ledger_now())
end

-- Parse a settle or release argv: id, maxlen, actual dims (zeros dropped, given order) and
-- actual amounts; or nil and a refusal.
local function ledger_parse_resolve(argv, kind)
  local id = argv[1]
  if not ledger_valid_id(id) then
    return nil, { 'invalid', 'reservation id must be 1..256 characters with no spaces' }
  end
  local maxlen = ledger_int(argv[2])
  if maxlen == nil or maxlen < 1 then
    return nil, { 'invalid', 'journal length must be a positive integer' }
  end
  local dims, amounts, err = ledger_parse_pairs(argv, 3)
  if err then
    return nil, { 'invalid', err }
  end
  if kind == 'release' and #dims > 0 then
    return nil, { 'invalid', 'release takes no amounts' }
  end
  local actual_dims, actual = {}, {}
  for _, d in ipairs(dims) do
    if amounts[d] > 0 then
      actual_dims[#actual_dims + 1] = d
      actual[d] = amounts[d]
    end
  end
  return { id = id, maxlen = maxlen, dims = actual_dims, actual = actual }
end

local function ledger_same_actual(rec, req)
  local stored = 0
  for _ in pairs(rec.actual) do
    stored = stored + 1
  end
  if stored ~= #req.dims then
    return false
  end
  for _, d in ipairs(req.dims) do
    if rec.actual[d] ~= req.actual[d] then
      return false
    end
  end
  return true
end

-- Flat { dim, amount, ... } of actual above the reserved amount.
local function ledger_overage(rec, req)
  local out = {}
  for _, d in ipairs(req.dims) do
    local over = req.actual[d] - (rec.amount[d] or 0)
    if over > 0 then
      out[#out + 1] = d
      out[#out + 1] = over
    end
  end
  return out
end

-- The record of a resolve request and, when it is refused or a replay, the reply.
local function ledger_lookup(keys, req)
  local raw = redis.call('HGET', keys[3], 'r:' .. req.id)
  if not raw then
    return nil, { 'unknown' }
  end
  local rec = ledger_decode(raw)
  if rec.state == 'S' or rec.state == 'R' then
    if ledger_same_actual(rec, req) then
      return rec, { 'settled', 1, ledger_overage(rec, req), 0 }
    end
    return rec, { 'conflict' }
  end
  return rec, nil
end

-- The bucket of each actual dimension the reservation did not name: the bucket the dimension
-- had when the reservation was admitted. Registers dimensions never seen before.
local function ledger_extra_buckets(keys, rec, req)
  local extra = {}
  for _, d in ipairs(req.dims) do
    if rec.amount[d] == nil then
      extra[#extra + 1] = d
    end
  end
  local buckets = {}
  if #extra == 0 then
    return extra, buckets
  end
  local raw = redis.call('HMGET', keys[1], unpack(extra))
  for i, d in ipairs(extra) do
    local _, _, period = ledger_parse_limit(raw[i])
    buckets[d] = ledger_bucket(period, rec.created)
    if not raw[i] then
      redis.call('HSET', keys[1], d, LEDGER_UNLIMITED)
    end
  end
  return extra, buckets
end

-- Book the resolution of a pending or expired reservation.
local function ledger_book_resolution(keys, req, rec, kind, now)
  local extra, extra_bucket = ledger_extra_buckets(keys, rec, req)
  local pending = rec.state == 'P'
  local fields, delta, changes, actual_parts = {}, {}, {}, {}
  for _, d in ipairs(rec.dims) do
    local b, held, spent = rec.bucket[d], rec.amount[d], req.actual[d] or 0
    local c = 'c:' .. d .. ':' .. b
    fields[#fields + 1] = c
    if pending then
      local r = 'r:' .. d .. ':' .. b
      fields[#fields + 1] = r
      delta[c], delta[r] = spent, -held
      changes[#changes + 1] = d .. '@' .. b .. ':' .. ledger_fmt(spent) .. ':' .. ledger_fmt(-held)
    else
      delta[c] = spent - held
      changes[#changes + 1] = d .. '@' .. b .. ':' .. ledger_fmt(spent - held) .. ':0'
    end
    if spent > 0 then
      actual_parts[#actual_parts + 1] = d .. ':' .. b .. ':' .. ledger_fmt(spent)
    end
  end
  for _, d in ipairs(extra) do
    local b, spent = extra_bucket[d], req.actual[d]
    local c = 'c:' .. d .. ':' .. b
    fields[#fields + 1] = c
    delta[c] = spent
    changes[#changes + 1] = d .. '@' .. b .. ':' .. ledger_fmt(spent) .. ':0'
    actual_parts[#actual_parts + 1] = d .. ':' .. b .. ':' .. ledger_fmt(spent)
  end
  ledger_adjust(keys[2], fields, delta)

  local overage = ledger_overage(rec, req)
  local extras = {}
  if #overage > 0 then
    local parts = {}
    for i = 1, #overage, 2 do
      parts[#parts + 1] = overage[i] .. ':' .. ledger_fmt(overage[i + 1])
    end
    extras[#extras + 1] = 'overage'
    extras[#extras + 1] = table.concat(parts, ',')
  end
  if pending then
    redis.call('ZREM', keys[4], req.id)
  else
    extras[#extras + 1] = 'corrects'
    extras[#extras + 1] = 'expire'
  end
  local state = kind == 'release' and 'R' or 'S'
  redis.call('HSET', keys[3], 'r:' .. req.id, state .. '|' .. ledger_fmt(rec.deadline)
    .. '|' .. ledger_fmt(rec.created) .. '|' .. rec.soft_text .. '|'
    .. rec.amounts_text .. '|' .. table.concat(actual_parts, ','))
  redis.call('ZADD', keys[5], now, 'r:' .. req.id)
  ledger_journal(keys, req.maxlen, now, kind, req.id, table.concat(changes, ';'),
    #extras > 0 and extras or nil)
  return { 'settled', 0, overage, pending and 0 or 1 }
end

-- Settle (kind 'settle') or release (kind 'release', no pairs) at time `now`.
-- argv as for ledger_settle; the reply is documented at the top of this file.
local function ledger_resolve_at(keys, argv, now, kind)
  local req, refusal = ledger_parse_resolve(argv, kind)
  if not req then
    return refusal
  end
  ledger_expire_due(keys, now, LEDGER_EXPIRE_BATCH, req.maxlen)
  local rec, answer = ledger_lookup(keys, req)
  if answer then
    return answer
  end
  return ledger_book_resolution(keys, req, rec, kind, now)
end

local function ledger_settle_at(keys, argv, now)
  return ledger_resolve_at(keys, argv, now, 'settle')
end

local function ledger_release_at(keys, argv, now)
  return ledger_resolve_at(keys, argv, now, 'release')
end

-- The embedding entry points documented at the top of this file.
local function ledger_settle(keys, argv)
  return ledger_settle_at(keys, argv, ledger_now())
end

local function ledger_settle_check(keys, argv)
  local req, refusal = ledger_parse_resolve(argv, 'settle')
  if not req then
    return refusal
  end
  local _, answer = ledger_lookup(keys, req)
  if answer and answer[1] ~= 'settled' then
    return answer
  end
  return nil
end
