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

local want, fields = {}, {}
local usage = redis.call('HGETALL', KEYS[LEDGER_K_USAGE])
for i = 1, #usage, 2 do
  if string.sub(usage[i], 1, 2) == 'r:' then
    fields[#fields + 1] = usage[i]
    want[usage[i]] = 0
  end
end
local ids = redis.call('ZRANGE', KEYS[LEDGER_K_DEADLINES], 0, -1)
for _, id in ipairs(ids) do
  local raw = redis.call('HGET', KEYS[LEDGER_K_RECORDS], 'r:' .. id)
  if raw then
    local rec = ledger_decode(raw)
    for _, d in ipairs(rec.dims) do
      local f = 'r:' .. d .. ':' .. rec.bucket[d]
      if want[f] == nil then
        fields[#fields + 1] = f
        want[f] = 0
      end
      want[f] = want[f] + rec.amount[d]
    end
  end
end

local have = {}
if #fields > 0 then
  local values = redis.call('HMGET', KEYS[LEDGER_K_USAGE], unpack(fields))
  for i, f in ipairs(fields) do
    have[f] = tonumber(values[i]) or 0
  end
end
local changes = {}
for _, f in ipairs(fields) do
  if have[f] ~= want[f] then
    local d, b = string.match(f, '^r:([%w_]+):([%w-]+)$')
    changes[#changes + 1] = { d, b, 0, want[f] - have[f] }
  end
end
if #changes > 0 then
  local journal = ledger_book(KEYS, changes, have)
  ledger_journal(KEYS, maxlen, now, 'rebuild', '-', journal)
end
return { #ids, #changes }
