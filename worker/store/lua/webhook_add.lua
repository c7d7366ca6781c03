--[[
Add a webhook endpoint to its tenant's set, unless the tenant has its cap already: the count
and the write in one step, so concurrent registrations cannot pass the cap together. The
endpoint's record (in the API's hash of endpoints, outside the tenant's slot) is written
before and removed again by the caller when this refuses.

KEYS
  1 the tenant's endpoint ids  turnstile:api:{<tenant>}:webhooks
  2 the deliverer's cursor     turnstile:api:{<tenant>}:cursor
ARGV
  1 the new endpoint's id
  2 the cap: endpoints a tenant may have
  3 now (ms): where the deliverer starts when this is the tenant's first endpoint
Returns
  {1, count} when added, {0, count} when refused (count: the tenant's endpoints after)
]]
local count = redis.call('SCARD', KEYS[1])
if count >= tonumber(ARGV[2]) then
  return {0, count}
end
redis.call('SADD', KEYS[1], ARGV[1])
-- Runs created before the tenant's first endpoint are not announced.
redis.call('SET', KEYS[2], ARGV[3], 'NX')
return {1, count + 1}
