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
return ledger_reserve_at(KEYS, ARGV, now)
