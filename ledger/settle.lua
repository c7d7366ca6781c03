--[[
settle: book what a step actually spent and release the rest of its hold.

KEYS  the six ledger keys of the tenant, in the order documented in lib.lua
ARGV  [1] reservation id
      [2] journal length (approximate cap)
      [3..] dimension, actual amount, ... (a dimension not named spent 0)

Pending: actual moves from reserved to committed, the rest of the hold is released. Expired
(charged in full): committed is corrected from the full amount to the actual. Actual above the
reservation is committed all the same and reported as overage. The reply is ledger_settle's,
documented in lib.lua.
]]

local now = ledger_now()
return ledger_settle_at(KEYS, ARGV, now)
