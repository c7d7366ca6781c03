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
  keys[6] journal    stream  one entry per change

Time is the server's `TIME`, read once per script by the operation file and passed down as
`now` (milliseconds). Buckets: a dimension's period is "none" (bucket "all"), "day" (bucket
"YYYY-MM-DD", UTC) or "month" ("YYYY-MM", UTC). A reservation belongs, for good, to the bucket
of each dimension at the moment it was admitted; its settlement and expiry are booked there.

Every function validates its whole input before its first write; a refusal writes nothing.
(Processing of due expiries happens after validation and is a complete change of its own.)

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
]]

local LEDGER_MAX_AMOUNT = 9007199254740992 -- 2^53: Lua numbers are doubles, exact up to here
local LEDGER_EXPIRE_BATCH = 16 -- due expiries handled per operation; the reaper does the rest
local LEDGER_MAX_ID = 256
local LEDGER_K_LIMITS, LEDGER_K_USAGE, LEDGER_K_RECORDS = 1, 2, 3
local LEDGER_K_DEADLINES, LEDGER_K_RESOLVED, LEDGER_K_JOURNAL = 4, 5, 6

local function ledger_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Integers always go to the server through "%d": tostring() would print 2^53 as 9.007e+15.
local function ledger_fmt(n)
  return string.format('%d', n)
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

local function ledger_valid_dim(d)
  return type(d) == 'string' and #d <= 64 and string.find(d, '^[a-z][a-z0-9_]*$') ~= nil
end

local function ledger_valid_id(id)
  return type(id) == 'string' and #id > 0 and #id <= LEDGER_MAX_ID
    and not string.find(id, '[%c%s]')
end

local function ledger_valid_period(p)
  return p == 'none' or p == 'day' or p == 'month'
end

-- argv[first], argv[first + 1], ... as dimension/amount pairs.
-- Returns dims (in the given order), amounts (dim -> number); or nil, nil, message.
local function ledger_parse_pairs(argv, first)
  local dims, amounts = {}, {}
  local n = #argv
  if n >= first and (n - first + 1) % 2 ~= 0 then
    return nil, nil, 'dimension and amount arguments must come in pairs'
  end
  for i = first, n, 2 do
    local d = argv[i]
    if not ledger_valid_dim(d) then
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

local LEDGER_UNLIMITED = '-|1|none'

-- A reservation record: "<state>|<deadline>|<created>|<amounts>|<soft>|<actual>"
--   state    P pending, X expired (charged in full, unsettled), S settled, R released
--   amounts  "dim:bucket:n,..." in the order reserved
--   soft     "dim,..." soft dimensions the reservation took past their ceiling
--   actual   "dim:bucket:n,..." the settled actual usage, zeros left out
local function ledger_decode(raw)
  local state, deadline, created, amounts, soft, actual =
    string.match(raw, '^(%u)|(%d+)|(%d+)|([^|]*)|([^|]*)|([^|]*)$')
  local rec = {
    state = state, deadline = tonumber(deadline), created = tonumber(created),
    dims = {}, amount = {}, bucket = {}, soft = {}, actual_dims = {}, actual = {},
    actual_bucket = {},
  }
  for d, b, n in string.gmatch(amounts, '([%w_]+):([%w-]+):(%d+)') do
    rec.dims[#rec.dims + 1] = d
    rec.amount[d] = tonumber(n)
    rec.bucket[d] = b
  end
  for d in string.gmatch(soft, '[%w_]+') do
    rec.soft[#rec.soft + 1] = d
  end
  for d, b, n in string.gmatch(actual, '([%w_]+):([%w-]+):(%d+)') do
    rec.actual_dims[#rec.actual_dims + 1] = d
    rec.actual[d] = tonumber(n)
    rec.actual_bucket[d] = b
  end
  return rec
end

local function ledger_encode(rec)
  local amounts, actual = {}, {}
  for i, d in ipairs(rec.dims) do
    amounts[i] = d .. ':' .. rec.bucket[d] .. ':' .. ledger_fmt(rec.amount[d])
  end
  for i, d in ipairs(rec.actual_dims) do
    actual[i] = d .. ':' .. rec.actual_bucket[d] .. ':' .. ledger_fmt(rec.actual[d])
  end
  return rec.state .. '|' .. ledger_fmt(rec.deadline) .. '|' .. ledger_fmt(rec.created) .. '|'
    .. table.concat(amounts, ',') .. '|' .. table.concat(rec.soft, ',') .. '|'
    .. table.concat(actual, ',')
end

-- Apply integer deltas to usage fields: `fields` in order, `deltas` field -> number.
-- `current` (field -> number) may carry values already read; the rest are read here.
local function ledger_apply(keys, fields, deltas, current)
  local missing = {}
  for _, f in ipairs(fields) do
    if current[f] == nil then
      missing[#missing + 1] = f
    end
  end
  if #missing > 0 then
    local values = redis.call('HMGET', keys[LEDGER_K_USAGE], unpack(missing))
    for i, f in ipairs(missing) do
      current[f] = tonumber(values[i]) or 0
    end
  end
  local args = {}
  for _, f in ipairs(fields) do
    args[#args + 1] = f
    args[#args + 1] = ledger_fmt(current[f] + deltas[f])
  end
  if #args > 0 then
    redis.call('HSET', keys[LEDGER_K_USAGE], unpack(args))
  end
end

-- A list of changes, each { dim, bucket, committed delta, reserved delta }, applied to usage
-- and returned as journal fields "<dim>@<bucket>" -> "<committed delta>,<reserved delta>".
local function ledger_book(keys, changes, current)
  local fields, deltas, journal = {}, {}, {}
  for _, ch in ipairs(changes) do
    local d, b, dc, dr = ch[1], ch[2], ch[3], ch[4]
    if dc ~= 0 then
      local f = 'c:' .. d .. ':' .. b
      if deltas[f] == nil then
        fields[#fields + 1] = f
        deltas[f] = 0
      end
      deltas[f] = deltas[f] + dc
    end
    if dr ~= 0 then
      local f = 'r:' .. d .. ':' .. b
      if deltas[f] == nil then
        fields[#fields + 1] = f
        deltas[f] = 0
      end
      deltas[f] = deltas[f] + dr
    end
    journal[#journal + 1] = d .. '@' .. b
    journal[#journal + 1] = ledger_fmt(dc) .. ',' .. ledger_fmt(dr)
  end
  ledger_apply(keys, fields, deltas, current or {})
  return journal
end

local function ledger_journal(keys, maxlen, now, op, id, fields)
  redis.call('XADD', keys[LEDGER_K_JOURNAL], 'MAXLEN', '~', maxlen, '*',
    'op', op, 'id', id, 'at_ms', ledger_fmt(now), unpack(fields))
end

-- Charge in full every pending reservation whose deadline is before `now`, oldest deadline
-- first, at most `limit` of them. Returns how many were charged.
local function ledger_expire_due(keys, now, limit, maxlen)
  local due = redis.call('ZRANGEBYSCORE', keys[LEDGER_K_DEADLINES], '-inf',
    '(' .. ledger_fmt(now), 'LIMIT', 0, limit)
  for _, id in ipairs(due) do
    local raw = redis.call('HGET', keys[LEDGER_K_RECORDS], 'r:' .. id)
    if raw then
      local rec = ledger_decode(raw)
      if rec.state == 'P' then
        local changes = {}
        for _, d in ipairs(rec.dims) do
          changes[#changes + 1] = { d, rec.bucket[d], rec.amount[d], -rec.amount[d] }
        end
        local fields = ledger_book(keys, changes)
        rec.state = 'X'
        redis.call('HSET', keys[LEDGER_K_RECORDS], 'r:' .. id, ledger_encode(rec))
        redis.call('ZADD', keys[LEDGER_K_RESOLVED], now, 'r:' .. id)
        fields[#fields + 1] = 'deadline_ms'
        fields[#fields + 1] = ledger_fmt(rec.deadline)
        ledger_journal(keys, maxlen, now, 'expire', id, fields)
      end
    end
    redis.call('ZREM', keys[LEDGER_K_DEADLINES], id)
  end
  return #due
end

-- Flat { dim, amount, ... } of actual above the reserved amount.
local function ledger_overage(rec, actual_dims, actual)
  local out = {}
  for _, d in ipairs(actual_dims) do
    local over = actual[d] - (rec.amount[d] or 0)
    if over > 0 then
      out[#out + 1] = d
      out[#out + 1] = over
    end
  end
  return out
end

local function ledger_same_actual(rec, actual_dims, actual)
  if #rec.actual_dims ~= #actual_dims then
    return false
  end
  for _, d in ipairs(actual_dims) do
    if rec.actual[d] ~= actual[d] then
      return false
    end
  end
  return true
end

-- Buckets for actual usage in dimensions the reservation did not name: the bucket each such
-- dimension had when the reservation was admitted. Registers never-seen dimensions.
local function ledger_extra_buckets(keys, rec, extra)
  local buckets = {}
  if #extra == 0 then
    return buckets
  end
  local raw = redis.call('HMGET', keys[LEDGER_K_LIMITS], unpack(extra))
  for i, d in ipairs(extra) do
    local _, _, period = ledger_parse_limit(raw[i])
    buckets[d] = ledger_bucket(period, rec.created)
    if not raw[i] then
      redis.call('HSET', keys[LEDGER_K_LIMITS], d, LEDGER_UNLIMITED)
    end
  end
  return buckets
end

-- Book a resolution of a pending or expired reservation; returns its overage and whether an
-- expiry charge was corrected.
local function ledger_book_resolution(keys, id, rec, actual_dims, actual, kind, now, maxlen)
  local extra = {}
  for _, d in ipairs(actual_dims) do
    if rec.amount[d] == nil then
      extra[#extra + 1] = d
    end
  end
  local extra_bucket = ledger_extra_buckets(keys, rec, extra)
  local pending = rec.state == 'P'
  local changes = {}
  for _, d in ipairs(rec.dims) do
    local spent, held = actual[d] or 0, rec.amount[d]
    if pending then
      changes[#changes + 1] = { d, rec.bucket[d], spent, -held }
    else
      changes[#changes + 1] = { d, rec.bucket[d], spent - held, 0 }
    end
    if spent > 0 then
      rec.actual_bucket[d] = rec.bucket[d]
    end
  end
  for _, d in ipairs(extra) do
    changes[#changes + 1] = { d, extra_bucket[d], actual[d], 0 }
    rec.actual_bucket[d] = extra_bucket[d]
  end
  local fields = ledger_book(keys, changes)
  local overage = ledger_overage(rec, actual_dims, actual)
  if #overage > 0 then
    local parts = {}
    for i = 1, #overage, 2 do
      parts[#parts + 1] = overage[i] .. ':' .. ledger_fmt(overage[i + 1])
    end
    fields[#fields + 1] = 'overage'
    fields[#fields + 1] = table.concat(parts, ',')
  end
  if pending then
    redis.call('ZREM', keys[LEDGER_K_DEADLINES], id)
  else
    fields[#fields + 1] = 'corrects'
    fields[#fields + 1] = 'expire'
  end
  rec.state = kind == 'release' and 'R' or 'S'
  rec.actual_dims, rec.actual = actual_dims, actual
  redis.call('HSET', keys[LEDGER_K_RECORDS], 'r:' .. id, ledger_encode(rec))
  redis.call('ZADD', keys[LEDGER_K_RESOLVED], now, 'r:' .. id)
  ledger_journal(keys, maxlen, now, kind, id, fields)
  return overage, pending and 0 or 1
end

-- Settle (kind 'settle') or release (kind 'release', no pairs) at time `now`.
-- argv as for ledger_settle; the reply is documented at the top of this file.
local function ledger_resolve_at(keys, argv, now, kind)
  local id = argv[1]
  if not ledger_valid_id(id) then
    return { 'invalid', 'reservation id must be 1..256 characters with no spaces' }
  end
  local maxlen = ledger_int(argv[2])
  if maxlen == nil or maxlen < 1 then
    return { 'invalid', 'journal length must be a positive integer' }
  end
  local dims, amounts, err = ledger_parse_pairs(argv, 3)
  if err then
    return { 'invalid', err }
  end
  if kind == 'release' and #dims > 0 then
    return { 'invalid', 'release takes no amounts' }
  end
  local actual_dims, actual = {}, {}
  for _, d in ipairs(dims) do
    if amounts[d] > 0 then
      actual_dims[#actual_dims + 1] = d
      actual[d] = amounts[d]
    end
  end
  ledger_expire_due(keys, now, LEDGER_EXPIRE_BATCH, maxlen)
  local raw = redis.call('HGET', keys[LEDGER_K_RECORDS], 'r:' .. id)
  if not raw then
    return { 'unknown' }
  end
  local rec = ledger_decode(raw)
  if rec.state == 'S' or rec.state == 'R' then
    if ledger_same_actual(rec, actual_dims, actual) then
      return { 'settled', 1, ledger_overage(rec, actual_dims, actual), 0 }
    end
    return { 'conflict' }
  end
  local overage, corrected =
    ledger_book_resolution(keys, id, rec, actual_dims, actual, kind, now, maxlen)
  return { 'settled', 0, overage, corrected }
end

local function ledger_settle_at(keys, argv, now)
  return ledger_resolve_at(keys, argv, now, 'settle')
end

local function ledger_release_at(keys, argv, now)
  return ledger_resolve_at(keys, argv, now, 'release')
end

-- The embedding entry point documented at the top of this file.
local function ledger_settle(keys, argv)
  return ledger_settle_at(keys, argv, ledger_now())
end
