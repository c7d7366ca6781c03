--[[
prune: forget the usage figures of period buckets that have ended and that nothing can still
change. Without it a day-period tenant gains two usage fields per dimension every day, for good.

A bucket is old when it ends before the previous period of its own kind: a day bucket
("YYYY-MM-DD") before yesterday, a month bucket ("YYYY-MM") before last month. So the current
and the previous period are always kept, and the "all" bucket of period "none" never goes.
A bucket is still needed while a reservation made in it is pending (its settlement or expiry
books there) or expired and unsettled (a late settle corrects there). Only reservations made
in a bucket book in it, and no new one is made in an old bucket, so once an old bucket is not
needed it never will be again: the caller may look for the expired ones outside this script.

KEYS  the six ledger keys of the tenant, in the order documented in lib.lua
ARGV  [1] mode: "old" lists the old buckets; "prune" removes the buckets named next
      [2] journal length (approximate cap)
      [3] with "prune": the operation id, for the journal
      [4..] with "prune": bucket names the caller found no expired, unsettled reservation of

Replies:
  "old":   { bucket, ... } every old bucket with a usage field, sorted
  "prune": { pruned fields, { bucket, ... } pruned } (a bucket named that is not old, that a
           pending reservation was made in, or that still holds a reserved amount, is kept)
A prune writes one journal entry (op "prune") naming the fields it removed and their values.
]]

local now = ledger_now()
local mode = ARGV[1]
local maxlen = ledger_int(ARGV[2])
if maxlen == nil or maxlen < 1 then
  return { 'invalid', 'journal length must be a positive integer' }
end
if mode ~= 'old' and mode ~= 'prune' then
  return { 'invalid', 'mode must be old or prune' }
end

local today = ledger_bucket('day', now)
local yesterday = ledger_bucket('day', now - 86400000)
local day_of_month = tonumber(string.sub(today, 9, 10))
local last_month = ledger_bucket('month', now - day_of_month * 86400000)

local function ledger_old(bucket)
  if string.find(bucket, '^%d%d%d%d%-%d%d%-%d%d$') then
    return bucket < yesterday
  end
  if string.find(bucket, '^%d%d%d%d%-%d%d$') then
    return bucket < last_month
  end
  return false
end

local fields = redis.call('HKEYS', KEYS[2])
if mode == 'old' then
  local seen, out = {}, {}
  for _, f in ipairs(fields) do
    local b = string.match(f, '^[cr]:[%w_]+:([%w-]+)$')
    if b and not seen[b] and ledger_old(b) then
      seen[b] = true
      out[#out + 1] = b
    end
  end
  table.sort(out)
  return out
end

local id = ARGV[3]
if not ledger_valid_id(id) then
  return { 'invalid', 'operation id must be 1..256 characters with no spaces' }
end
local asked = {}
for i = 4, #ARGV do
  if ledger_old(ARGV[i]) then
    asked[ARGV[i]] = true
  end
end
-- Pending reservations are few (the holds live right now): their buckets stay.
local pending = redis.call('ZRANGE', KEYS[4], 0, -1)
for _, rid in ipairs(pending) do
  local raw = redis.call('HGET', KEYS[3], 'r:' .. rid)
  if raw then
    local _, _, created = ledger_decode(raw)
    local created_ms = tonumber(created)
    asked[ledger_bucket('day', created_ms)] = nil
    asked[ledger_bucket('month', created_ms)] = nil
  end
end
local values = redis.call('HGETALL', KEYS[2])
for i = 1, #values, 2 do
  local kind, b = string.match(values[i], '^([cr]):[%w_]+:([%w-]+)$')
  if kind == 'r' and asked[b] and tonumber(values[i + 1]) ~= 0 then
    asked[b] = nil
  end
end
local gone, removed, buckets, seen = {}, {}, {}, {}
for i = 1, #values, 2 do
  local b = string.match(values[i], '^[cr]:[%w_]+:([%w-]+)$')
  if b and asked[b] then
    gone[#gone + 1] = values[i]
    removed[#removed + 1] = values[i] .. '=' .. values[i + 1]
    if not seen[b] then
      seen[b] = true
      buckets[#buckets + 1] = b
    end
  end
end
if #gone == 0 then
  return { 0, {} }
end
table.sort(buckets)
redis.call('HDEL', KEYS[2], unpack(gone))
redis.call('XADD', KEYS[6], 'MAXLEN', '~', maxlen, '*', 'op', 'prune', 'id', id,
  'at_ms', string.format('%d', now), 'changes', '', 'buckets', table.concat(buckets, ','),
  'removed', table.concat(removed, ';'))
return { #gone, buckets }
