--[[
release: resolve a reservation that spent nothing (a settle with an actual of zero).

KEYS  the six ledger keys of the tenant, in the order documented in lib.lua
ARGV  [1] reservation id
      [2] journal length (approximate cap)

The reply is ledger_settle's, documented in lib.lua; a release after a settle of zero is a
replay, after any other settle a conflict.
]]

local now = ledger_now()
return ledger_settle_at(KEYS, ARGV, now, 'release')
