--[[
reserve: hold the worst case of one step against every ceiling at once, or hold nothing.

KEYS  the six ledger keys of the tenant, in the order documented in lib.lua
ARGV  [1] reservation id
      [2] timeout in ms: how long the external work may still run
      [3] grace margin in ms, added to the deadline for usage that reports late
      [4] journal length (approximate cap)
      [5..] dimension, amount, dimension, amount, ... (at least one pair)

The deadline is the server's TIME + timeout + grace. Admitted when, in every hard dimension
named, committed + reserved + amount <= ceiling in the dimension's current period bucket.
Replies:
  { 'admitted', deadline_ms, replayed (0|1), { soft dim, ... }, newly_indexed (0|1) }
      newly_indexed 1: the caller must add the tenant to the reaper's set
  { 'rejected', { dim, requested, available, ... }, { soft dim, ... } }
      every hard dimension that does not fit, in ARGV order; nothing was written
  { 'conflict' }            the id was admitted before with other amounts; nothing written
  { 'invalid', message }    nothing written
A rejected attempt leaves no trace, so the same id may be tried again later.
]]

local now = ledger_now()
local id = ARGV[1]
if not ledger_valid_id(id) then
  return { 'invalid', 'reservation id must be 1..256 characters with no spaces' }
end
local timeout_ms, grace_ms, maxlen = ledger_int(ARGV[2]), ledger_int(ARGV[3]), ledger_int(ARGV[4])
if timeout_ms == nil or grace_ms == nil then
  return { 'invalid', 'timeout and grace must be integers of milliseconds' }
end
if maxlen == nil or maxlen < 1 then
  return { 'invalid', 'journal length must be a positive integer' }
end
local dims, amounts, err = ledger_parse_pairs(ARGV, 5)
if err then
  return { 'invalid', err }
end
if #dims == 0 then
  return { 'invalid', 'nothing to reserve' }
end

ledger_expire_due(KEYS, now, LEDGER_EXPIRE_BATCH, maxlen)

local record_field = 'r:' .. id
local existing = redis.call('HGET', KEYS[3], record_field)
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
local limits = redis.call('HMGET', KEYS[1], unpack(dims))
local bucket, ceiling, hard, fields = {}, {}, {}, {}
for i, d in ipairs(dims) do
  local c, h, p = ledger_parse_limit(limits[i])
  ceiling[d], hard[d] = c, h
  bucket[d] = ledger_bucket(p, now)
  fields[2 * i - 1] = 'c:' .. d .. ':' .. bucket[d]
  fields[2 * i] = 'r:' .. d .. ':' .. bucket[d]
end
fields[#fields + 1] = 'indexed'
local values = redis.call('HMGET', KEYS[2], unpack(fields))

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
    redis.call('HSET', KEYS[1], d, LEDGER_UNLIMITED)
  end
end
local newly_indexed = values[#fields] and 0 or 1
if newly_indexed == 1 then
  writes[#writes + 1] = 'indexed'
  writes[#writes + 1] = '1'
end
redis.call('HSET', KEYS[2], unpack(writes))
redis.call('HSET', KEYS[3], record_field, 'P|' .. ledger_fmt(deadline) .. '|' .. ledger_fmt(now)
  .. '|' .. table.concat(soft, ',') .. '|' .. table.concat(parts, ',') .. '|')
redis.call('ZADD', KEYS[4], deadline, id)
ledger_journal(KEYS, maxlen, now, 'reserve', id, table.concat(changes, ';'),
  { 'deadline_ms', ledger_fmt(deadline) })
return { 'admitted', deadline, 0, soft, newly_indexed }
