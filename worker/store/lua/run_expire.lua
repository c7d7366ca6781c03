--[[
Remove one finished run whose retention ran out: its hash, its event and live streams, its entries in
the tenant's indexes, at once. Only a run that is stopped, with the outcome the caller read,
and that ended (updated_ms) at or before the cutoff is removed; anything else is left as it is.
A runs-index entry with no hash behind it (nothing else can leave one) is removed too.
The run-tenants map is not tenant-tagged (another slot): the caller clears it after this.

KEYS
  1 run hash        turnstile:{T}:run:<id>
  2 events stream   turnstile:{T}:events:<id>
  3 runs zset       turnstile:{T}:runs
  4 status set      turnstile:{T}:status:stopped
  5 outcome set     turnstile:{T}:outcome:<outcome the caller read> (any tenant key if none)
  6 leases zset     turnstile:{T}:leases
  7 inflight hash   turnstile:{T}:inflight
  8 live stream     turnstile:{T}:live:<id>
ARGV
  1 run id
  2 cutoff (server ms): the run must have ended at or before it
  3 the outcome the caller read ("" for none)
Returns
  1 removed | 0 kept (not stopped, ended after the cutoff, or its outcome changed)
]]
local run_id = ARGV[1]
local fields = redis.call('HMGET', KEYS[1], 'status', 'updated_ms', 'outcome')
local status, updated, outcome = fields[1], tonumber(fields[2]), fields[3] or ''
if status then
  if status ~= 'stopped' or updated == nil or updated > tonumber(ARGV[2]) then
    return 0
  end
  if outcome ~= ARGV[3] then
    return 0
  end
end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[8])
redis.call('ZREM', KEYS[3], run_id)
redis.call('SREM', KEYS[4], run_id)
if ARGV[3] ~= '' then
  redis.call('SREM', KEYS[5], run_id)
end
redis.call('ZREM', KEYS[6], run_id)
redis.call('HDEL', KEYS[7], run_id)
return 1
