--[[
Set fields on a run that a later step acts on (a cancel requested while its turn is in flight),
compare-and-set on the version and the status, without moving the run on: the turn in flight
still commits, and the next step finds the request.

KEYS
  1 run hash        turnstile:{T}:run:<id>
  2 events stream   turnstile:{T}:events:<id>
ARGV
  1 expected version
  2 expected status
  3 events stream max length
  4 the event JSON to append
  then field, value pairs to set
Returns
  {"ok", version} | {"stale", version, status} | {"missing"}
]]
local version, status = unpack(redis.call('HMGET', KEYS[1], 'version', 'status'))
if not version then
  return {'missing'}
end
if version ~= ARGV[1] or status ~= ARGV[2] then
  return {'stale', version, status or ''}
end
local fields = {}
for j = 5, #ARGV do
  fields[#fields + 1] = ARGV[j]
end
if #fields > 0 then
  redis.call('HSET', KEYS[1], unpack(fields))
end
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[3], '*', 'event', ARGV[4])
return {'ok', version}
