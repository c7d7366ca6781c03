--[[
read: every dimension with a ceiling or any usage, in its current period bucket.

KEYS  the six ledger keys of the tenant, in the order documented in lib.lua
ARGV  [1] journal length (approximate cap), for the expiries this call may process

Reply: one row per dimension, in no particular order:
  { dimension, ceiling ('-' when unlimited), hard (1|0), period, bucket, committed, reserved }
Due expiries are charged first, so the figures are the ones the next reserve would see.
]]

local now = ledger_now()
local maxlen = ledger_int(ARGV[1])
if maxlen == nil or maxlen < 1 then
  return { 'invalid', 'journal length must be a positive integer' }
end
ledger_expire_due(KEYS, now, LEDGER_EXPIRE_BATCH, maxlen)

local limits = redis.call('HGETALL', KEYS[1])
local out, fields = {}, {}
for i = 1, #limits, 2 do
  local d = limits[i]
  local ceiling, h, p = ledger_parse_limit(limits[i + 1])
  local c = tonumber(ceiling)
  local b = ledger_bucket(p, now)
  out[#out + 1] = { d, c and string.format('%d', c) or '-', h == '1' and 1 or 0, p, b }
  fields[#fields + 1] = 'c:' .. d .. ':' .. b
  fields[#fields + 1] = 'r:' .. d .. ':' .. b
end
if #fields == 0 then
  return {}
end
local values = redis.call('HMGET', KEYS[2], unpack(fields))
for i, row in ipairs(out) do
  row[6] = tonumber(values[2 * i - 1]) or 0
  row[7] = tonumber(values[2 * i]) or 0
end
return out
