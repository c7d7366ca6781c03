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
A script that has read TIME already calls ledger_settle_at(keys, argv, now) and
ledger_reserve_at(keys, argv, now) instead; one that makes several ledger changes at one `now`
may charge the due expiries once, first (ledger_expire_due(keys, now, LEDGER_EXPIRE_BATCH,
journal_maxlen)), and pass `expired` true to each.

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
-- One "dim:bucket:n" item of a record's amounts or actual (see ledger_decode).
local LEDGER_ITEM = '([%w_]+):([%w-]+):(%d+)'

-- Numbers go into strings through string.format('%d', n) only: concatenation would print
-- 2^53 as 9.007e+15.
--
-- The hot paths (reserve, settle) allocate little: every table and string a script makes is
-- garbage the server's allocator and Lua's collector pay for on each call, so lists are
-- joined as they are built and no record is decoded into tables.

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
  local n = #argv
  if (n - first + 1) % 2 ~= 0 then
    return nil, nil, 'dimension and amount arguments must come in pairs'
  end
  local dims, amounts, count = {}, {}, 0
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
    count = count + 1
    dims[count] = d
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

-- A limits entry as its three parts, as text: ceiling ('-': unlimited; tonumber gives nil),
-- hard ('1') or soft ('0'), period. A dimension never configured is unlimited, hard, and
-- counted under period "none".
local function ledger_parse_limit(raw)
  if not raw then
    return '-', '1', 'none'
  end
  return string.match(raw, '^([^|]*)|([01])|(%a+)$')
end

-- A reservation record: "<state>|<deadline>|<created>|<soft>|<amounts>|<actual>"
--   state    P pending, X expired (charged in full, unsettled), S settled, R released
--   soft     "dim,..." soft dimensions the reservation took past their ceiling
--   amounts  "dim:bucket:n,..." in the order reserved
--   actual   "dim:bucket:n,..." the settled actual usage, zeros left out
-- Returns the six parts as strings; walk amounts and actual with gmatch(text, LEDGER_ITEM).
local function ledger_decode(raw)
  return string.match(raw, '^(%u)|(%d+)|(%d+)|([^|]*)|([^|]*)|([^|]*)$')
end

-- Add deltas[i] to usage field fields[i]: one read, one write. `fields` becomes the HSET
-- arguments, field and new value in turn, filled from the end so that each field is read
-- before its slot is written.
local function ledger_adjust(usage_key, fields, deltas)
  local values = redis.call('HMGET', usage_key, unpack(fields))
  for i = #fields, 1, -1 do
    fields[2 * i - 1] = fields[i]
    fields[2 * i] = string.format('%d', (tonumber(values[i]) or 0) + deltas[i])
  end
  redis.call('HSET', usage_key, unpack(fields))
end

-- Charge in full every pending reservation whose deadline is before `now`, oldest deadline
-- first, at most `limit` of them. Returns how many were charged.
local function ledger_expire_due(keys, now, limit, maxlen)
  local due = redis.call('ZRANGEBYSCORE', keys[4], '-inf', '(' .. string.format('%d', now),
    'LIMIT', 0, limit)
  for _, id in ipairs(due) do
    local field = 'r:' .. id
    local raw = redis.call('HGET', keys[3], field)
    if raw and string.sub(raw, 1, 1) == 'P' then
      local _, deadline, _, _, amounts = ledger_decode(raw)
      local fields, deltas, changes = {}, {}, {}
      for d, b, held in string.gmatch(amounts, LEDGER_ITEM) do
        local i = #changes + 1
        held = tonumber(held)
        fields[2 * i - 1], fields[2 * i] = 'c:' .. d .. ':' .. b, 'r:' .. d .. ':' .. b
        deltas[2 * i - 1], deltas[2 * i] = held, -held
        changes[i] = d .. '@' .. b .. ':' .. string.format('%d', held) .. ':'
          .. string.format('%d', -held)
      end
      ledger_adjust(keys[2], fields, deltas)
      redis.call('HSET', keys[3], field, 'X' .. string.sub(raw, 2))
      redis.call('ZADD', keys[5], now, field)
      redis.call('XADD', keys[6], 'MAXLEN', '~', maxlen, '*', 'op', 'expire', 'id', id,
        'at_ms', string.format('%d', now), 'changes', table.concat(changes, ';'),
        'deadline_ms', deadline)
    end
    redis.call('ZREM', keys[4], id)
  end
  return #due
end

-- Reserve at time `now`: the body of reserve.lua, so that another script can take a hold in
-- the same atomic step as its own reads (the worker's load script does). keys and argv as in
-- reserve.lua; the reply is reserve.lua's. `expired`: the caller charged the due expiries at
-- this `now` already (ledger_expire_due), in the same script.
local function ledger_reserve_at(keys, argv, now, expired)
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
  local n = #dims
  if n == 0 then
    return { 'invalid', 'nothing to reserve' }
  end

  if not expired then
    ledger_expire_due(keys, now, LEDGER_EXPIRE_BATCH, maxlen)
  end

  local record_field = 'r:' .. id
  local existing = redis.call('HGET', keys[3], record_field)
  if existing then
    -- A replay when the record holds exactly these amounts.
    local _, deadline, _, soft_text, held = ledger_decode(existing)
    local count, same = 0, true
    for d, _, amount in string.gmatch(held, LEDGER_ITEM) do
      count = count + 1
      same = same and amounts[d] == tonumber(amount)
    end
    if not same or count ~= n then
      return { 'conflict' }
    end
    local soft = {}
    for d in string.gmatch(soft_text, '[%w_]+') do
      soft[#soft + 1] = d
    end
    return { 'admitted', tonumber(deadline), 1, soft, 0 }
  end

  -- Usage fields: committed and reserved of each dimension in its current bucket, then the
  -- tenant's "indexed" mark.
  local limits = redis.call('HMGET', keys[1], unpack(dims))
  local fields = {}
  for i = 1, n do
    local d = dims[i]
    local _, _, period = ledger_parse_limit(limits[i])
    local b = ledger_bucket(period, now)
    fields[2 * i - 1] = 'c:' .. d .. ':' .. b
    fields[2 * i] = 'r:' .. d .. ':' .. b
  end
  fields[2 * n + 1] = 'indexed'
  local values = redis.call('HMGET', keys[2], unpack(fields))

  -- Check every dimension. On the way, turn `fields` into the HSET arguments of the new
  -- reserved figures and write the record's amounts and the journal's changes: all of it is
  -- used only if every dimension fits.
  local rejected, soft, parts, changes = nil, {}, '', ''
  for i = 1, n do
    local d = dims[i]
    local amount = amounts[d]
    local ceiling, hard, period = ledger_parse_limit(limits[i])
    local cap = tonumber(ceiling)
    local reserved = tonumber(values[2 * i]) or 0
    local used = (tonumber(values[2 * i - 1]) or 0) + reserved
    -- Subtract rather than add: used + amount would round to 2^53 where it passes it by one.
    if used > LEDGER_MAX_AMOUNT or amount > LEDGER_MAX_AMOUNT - used then
      return { 'invalid', 'total of ' .. d .. ' would pass 2^53' }
    end
    if cap ~= nil and used + amount > cap then
      if hard == '1' then
        rejected = rejected or {}
        rejected[#rejected + 1] = d
        rejected[#rejected + 1] = amount
        rejected[#rejected + 1] = math.max(0, cap - used)
      else
        soft[#soft + 1] = d
      end
    end
    local b, text = ledger_bucket(period, now), string.format('%d', amount)
    fields[2 * i - 1] = fields[2 * i]
    fields[2 * i] = string.format('%d', reserved + amount)
    if i == 1 then
      parts = d .. ':' .. b .. ':' .. text
      changes = d .. '@' .. b .. ':0:' .. text
    else
      parts = parts .. ',' .. d .. ':' .. b .. ':' .. text
      changes = changes .. ';' .. d .. '@' .. b .. ':0:' .. text
    end
  end
  if rejected then
    return { 'rejected', rejected, soft }
  end

  for i = 1, n do
    if not limits[i] then
      redis.call('HSET', keys[1], dims[i], LEDGER_UNLIMITED)
    end
  end
  local newly_indexed = 0
  if not values[2 * n + 1] then
    newly_indexed = 1
    fields[2 * n + 2] = '1' -- after 'indexed'
  end
  redis.call('HSET', keys[2], unpack(fields, 1, 2 * (n + newly_indexed)))
  local deadline = now + timeout_ms + grace_ms
  local deadline_text, now_text = string.format('%d', deadline), string.format('%d', now)
  redis.call('HSET', keys[3], record_field, 'P|' .. deadline_text .. '|' .. now_text .. '|'
    .. table.concat(soft, ',') .. '|' .. parts .. '|')
  redis.call('ZADD', keys[4], deadline, id)
  redis.call('XADD', keys[6], 'MAXLEN', '~', maxlen, '*', 'op', 'reserve', 'id', id,
    'at_ms', now_text, 'changes', changes, 'deadline_ms', deadline_text)
  return { 'admitted', deadline, 0, soft, newly_indexed }
end

local function ledger_reserve(keys, argv)
  return ledger_reserve_at(keys, argv, ledger_now())
end

-- Parse a settle or release argv. Returns nil, id, maxlen, dims (the actual dimensions with
-- a non-zero amount, in the given order) and actual (dim -> amount, zeros included: go
-- through dims); or the refusal.
local function ledger_parse_resolve(argv, kind)
  local id = argv[1]
  if not ledger_valid_id(id) then
    return { 'invalid', 'reservation id must be 1..256 characters with no spaces' }
  end
  local maxlen = ledger_int(argv[2])
  if maxlen == nil or maxlen < 1 then
    return { 'invalid', 'journal length must be a positive integer' }
  end
  local dims, actual, err = ledger_parse_pairs(argv, 3)
  if err then
    return { 'invalid', err }
  end
  local n = #dims
  if kind == 'release' and n > 0 then
    return { 'invalid', 'release takes no amounts' }
  end
  for i = 1, n do
    if actual[dims[i]] == 0 then
      local kept = {}
      for j = 1, n do
        if actual[dims[j]] > 0 then
          kept[#kept + 1] = dims[j]
        end
      end
      return nil, id, maxlen, kept, actual
    end
  end
  return nil, id, maxlen, dims, actual
end

-- Flat { dim, amount, ... } of actual above the held amount (dim -> number), in dims order.
local function ledger_overage(held, dims, actual)
  local out = {}
  for i = 1, #dims do
    local d = dims[i]
    local over = actual[d] - (held[d] or 0)
    if over > 0 then
      out[#out + 1] = d
      out[#out + 1] = over
    end
  end
  return out
end

-- The record a settlement books. Returns nil and the record's parts (see ledger_decode) when
-- there is something to book; else the reply: 'unknown', a replay, or 'conflict'.
local function ledger_lookup(keys, id, dims, actual)
  local raw = redis.call('HGET', keys[3], 'r:' .. id)
  if not raw then
    return { 'unknown' }
  end
  local state, deadline, created, soft, amounts, spent = ledger_decode(raw)
  if state ~= 'S' and state ~= 'R' then
    return nil, state, deadline, created, soft, amounts
  end
  -- Already resolved: a replay only when the stored actual is exactly this one.
  local stored, same = 0, true
  for d, _, n in string.gmatch(spent, LEDGER_ITEM) do
    stored = stored + 1
    same = same and actual[d] == tonumber(n)
  end
  if not same or stored ~= #dims then
    return { 'conflict' }
  end
  local held = {}
  for d, _, n in string.gmatch(amounts, LEDGER_ITEM) do
    held[d] = tonumber(n)
  end
  return { 'settled', 1, ledger_overage(held, dims, actual), 0 }
end

-- Settle at time `now`: book the actual usage of a pending or expired reservation (kind
-- 'settle', the default), or release it (kind 'release', no pairs). argv as for
-- ledger_settle; the reply is documented at the top of this file. `expired` as for
-- ledger_reserve_at.
local function ledger_settle_at(keys, argv, now, kind, expired)
  kind = kind or 'settle'
  local refusal, id, maxlen, dims, actual = ledger_parse_resolve(argv, kind)
  if refusal then
    return refusal
  end
  if not expired then
    ledger_expire_due(keys, now, LEDGER_EXPIRE_BATCH, maxlen)
  end
  local reply, state, deadline, created, soft, amounts = ledger_lookup(keys, id, dims, actual)
  if reply then
    return reply
  end

  -- Each reserved dimension, in its reservation's bucket: pending, the hold moves to
  -- committed as the actual and the rest is released; expired (charged in full), committed
  -- is corrected from the hold to the actual.
  local pending = state == 'P'
  local held, fields, deltas, changes, booked, named = {}, {}, {}, '', '', 0
  for d, b, amount in string.gmatch(amounts, LEDGER_ITEM) do
    amount = tonumber(amount)
    held[d] = amount
    local spent = actual[d] or 0
    local spent_text = string.format('%d', spent)
    local sep = changes == '' and '' or ';'
    fields[#fields + 1] = 'c:' .. d .. ':' .. b
    if pending then
      fields[#fields + 1] = 'r:' .. d .. ':' .. b
      deltas[#deltas + 1] = spent
      deltas[#deltas + 1] = -amount
      changes = changes .. sep .. d .. '@' .. b .. ':' .. spent_text .. ':'
        .. string.format('%d', -amount)
    else
      deltas[#deltas + 1] = spent - amount
      changes = changes .. sep .. d .. '@' .. b .. ':' .. string.format('%d', spent - amount)
        .. ':0'
    end
    if spent > 0 then
      named = named + 1
      booked = booked .. (booked == '' and '' or ',') .. d .. ':' .. b .. ':' .. spent_text
    end
  end
  -- Actual dimensions the reservation did not name are booked in the bucket each had when
  -- the reservation was admitted; dimensions never seen before are registered.
  if named < #dims then
    local extra = {}
    for i = 1, #dims do
      if held[dims[i]] == nil then
        extra[#extra + 1] = dims[i]
      end
    end
    local limits = redis.call('HMGET', keys[1], unpack(extra))
    local created_ms = tonumber(created)
    for i, d in ipairs(extra) do
      local _, _, period = ledger_parse_limit(limits[i])
      local b = ledger_bucket(period, created_ms)
      if not limits[i] then
        redis.call('HSET', keys[1], d, LEDGER_UNLIMITED)
      end
      local spent_text = string.format('%d', actual[d])
      fields[#fields + 1] = 'c:' .. d .. ':' .. b
      deltas[#deltas + 1] = actual[d]
      changes = changes .. (changes == '' and '' or ';') .. d .. '@' .. b .. ':' .. spent_text
        .. ':0'
      booked = booked .. (booked == '' and '' or ',') .. d .. ':' .. b .. ':' .. spent_text
    end
  end
  ledger_adjust(keys[2], fields, deltas)

  local overage = ledger_overage(held, dims, actual)
  local record_field = 'r:' .. id
  if pending then
    redis.call('ZREM', keys[4], id)
  end
  redis.call('HSET', keys[3], record_field, (kind == 'release' and 'R' or 'S') .. '|' .. deadline
    .. '|' .. created .. '|' .. soft .. '|' .. amounts .. '|' .. booked)
  redis.call('ZADD', keys[5], now, record_field)
  if pending and #overage == 0 then
    redis.call('XADD', keys[6], 'MAXLEN', '~', maxlen, '*', 'op', kind, 'id', id,
      'at_ms', string.format('%d', now), 'changes', changes)
  else
    local entry = { 'XADD', keys[6], 'MAXLEN', '~', maxlen, '*', 'op', kind, 'id', id,
      'at_ms', string.format('%d', now), 'changes', changes }
    if #overage > 0 then
      local over = ''
      for i = 1, #overage, 2 do
        over = over .. (i == 1 and '' or ',') .. overage[i] .. ':'
          .. string.format('%d', overage[i + 1])
      end
      entry[#entry + 1] = 'overage'
      entry[#entry + 1] = over
    end
    if not pending then
      entry[#entry + 1] = 'corrects'
      entry[#entry + 1] = 'expire'
    end
    redis.call(unpack(entry))
  end
  return { 'settled', 0, overage, pending and 0 or 1 }
end

-- The embedding entry points documented at the top of this file.
local function ledger_settle(keys, argv)
  return ledger_settle_at(keys, argv, ledger_now())
end

local function ledger_settle_check(keys, argv)
  local refusal, id, _, dims, actual = ledger_parse_resolve(argv, 'settle')
  if refusal then
    return refusal
  end
  local reply = ledger_lookup(keys, id, dims, actual)
  if reply and reply[1] ~= 'settled' then
    return reply
  end
  return nil
end
