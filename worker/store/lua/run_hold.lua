--[[
Take a ledger hold for a run's turn while the turn runs (the extension of a turn that needs
more than its first hold, or the first hold of a run that carries none), and add its id to the
run's open holds, so that the next commit settles or releases it (see run_commit.lua). Only a
run still at the version the turn loaded, and still running, gets a hold: a turn that another
commit overtook may not leave one behind. This body follows the ledger's library (see
ledger/lib.lua), so `ledger_reserve` is in scope.

KEYS
  1 run hash        turnstile:{T}:run:<id>
  2-7               the tenant's six ledger keys, in the library's order
ARGV
  1 the version the turn loaded
  then ledger_reserve's argv, exactly as `Ledger.reserve_script_args` returns it
Returns
  {"stale"} (nothing reserved) | ledger_reserve's reply
]]
local version, status, open = unpack(redis.call('HMGET', KEYS[1], 'version', 'status', 'holds'))
if version ~= ARGV[1] or status ~= 'running' then
  return {'stale'}
end
local argv = {}
for j = 2, #ARGV do
  argv[j - 1] = ARGV[j]
end
local reply = ledger_reserve({KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]}, argv)
if reply[1] == 'admitted' then
  local id = argv[1]
  open = open or ''
  if not string.find(' ' .. open .. ' ', ' ' .. id .. ' ', 1, true) then
    redis.call('HSET', KEYS[1], 'holds', open == '' and id or open .. ' ' .. id)
  end
end
return reply
