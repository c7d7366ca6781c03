--[[
Put a webhook delivery in its endpoint's outbox: a new one (from the deliverer's scan of the
event streams, or moved from the shared outbox older servers kept), or one to try again after
a failed attempt. Only while the endpoint is registered: the endpoint's removal takes its id
out of the tenant's set before it deletes the outbox, so a scan or an attempt that ends after
the removal writes nothing (no outbox is left behind that no deliverer reads). A retry also
needs the delivery still there: one given up meanwhile is not brought back.

KEYS
  1 the tenant's endpoint ids  turnstile:api:{<tenant>}:webhooks
  2 the endpoint's outbox      turnstile:api:{<tenant>}:outbox:<endpoint id>
  3 its deliveries             turnstile:api:{<tenant>}:deliveries:<endpoint id>
  4 when each event was taken  turnstile:api:{<tenant>}:born:<endpoint id>
ARGV
  1 the endpoint's id
  2 the delivery's id
  3 the delivery's JSON
  4 when it is due (ms)
  5 when its event was taken (ms)
  6 "new" or "retry"
Returns
  1 when written, 0 when not (the endpoint is gone; for a retry, the delivery is gone)
]]
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 0 then
  return 0
end
if ARGV[6] == 'retry' then
  if not redis.call('ZSCORE', KEYS[2], ARGV[2]) then
    return 0
  end
  redis.call('HSET', KEYS[3], ARGV[2], ARGV[3])
  redis.call('ZADD', KEYS[2], ARGV[4], ARGV[2])
  return 1
end
-- A new one: a delivery already queued keeps its record and place.
redis.call('HSETNX', KEYS[3], ARGV[2], ARGV[3])
redis.call('ZADD', KEYS[2], 'NX', ARGV[4], ARGV[2])
redis.call('ZADD', KEYS[4], 'NX', ARGV[5], ARGV[2])
return 1
