--[[
rebuild: recompute every reserved figure from the pending reservations.

KEYS  the six ledger keys of the tenant, in the order documented in lib.lua
ARGV  [1] journal length (approximate cap)

Every due expiry is charged first. Then each "r:" usage field is set to the sum of the
pending holds booked in it; any difference is journaled as one 'rebuild' entry.
Reply: { pending, corrected } where corrected counts the usage fields that changed.
Work grows with the number of pending reservations and buckets: an operator's repair, not a
hot path.
]]

local now = ledger_now()
local maxlen = ledger_int(ARGV[1])
if maxlen == nil or maxlen < 1 then
  return { 'invalid', 'journal length must be a positive integer' }
end
while ledger_expire_due(KEYS, now, 1000, maxlen) == 1000 do
end

local want, have, fields = {}, {}, {}
local usage = redis.call('HGETALL', KEYS[2])
for i = 1, #usage, 2 do
  local f = usage[i]
  if string.sub(f, 1, 2) == 'r:' then
    fields[#fields + 1] = f
    want[f], have[f] = 0, tonumber(usage[i + 1]) or 0
  end
end
local ids = redis.call('ZRANGE', KEYS[4], 0, -1)
for _, id in ipairs(ids) do
  local raw = redis.call('HGET', KEYS[3], 'r:' .. id)
  if raw then
    local _, _, _, _, amounts = ledger_decode(raw)
    for d, b, amount in string.gmatch(amounts, LEDGER_ITEM) do
      local f = 'r:' .. d .. ':' .. b
      if want[f] == nil then
        fields[#fields + 1] = f
        want[f], have[f] = 0, 0
      end
      want[f] = want[f] + tonumber(amount)
    end
  end
end
local writes, changes = {}, {}
for _, f in ipairs(fields) do
  if have[f] ~= want[f] then
    local d, b = string.match(f, '^r:([%w_]+):([%w-]+)$')
    writes[#writes + 1] = f
    writes[#writes + 1] = string.format('%d', want[f])
    changes[#changes + 1] = d .. '@' .. b .. ':0:'
      .. string.format('%d', want[f] - have[f])
  end
end
if #writes > 0 then
  redis.call('HSET', KEYS[2], unpack(writes))
  redis.call('XADD', KEYS[6], 'MAXLEN', '~', maxlen, '*', 'op', 'rebuild', 'id', '-',
    'at_ms', string.format('%d', now), 'changes', table.concat(changes, ';'))
end
return { #ids, #changes }
