--[[
Draw one turn's request and tokens from a model endpoint's buckets (this body follows
rl_lib.lua): the endpoint's, and the tenant's share of it if it has one. All keys carry the
endpoint's hash tag, never a tenant's: a draw is a script of its own, pipelined beside the run's.

A turn that fits goes now. One that does not is deferred: it draws all the same (the levels go
below zero, so the turns deferred after it wait longer, each for its own turn) and its next
step is recorded as paid (KEYS 3), so that step's draw, when its wait is over, takes nothing.
A wait longer than the run may wait (ARGV 3: its deadline) draws nothing. A paid step that
finds the endpoint blocked by a 429 waits out the block, still paid.

KEYS
  1 endpoint bucket   turnstile:{rl:<endpoint>}:bucket
  2 tenant bucket     turnstile:{rl:<endpoint>}:tenant:<tenant>   (no limits: not used)
  3 paid zset         turnstile:{rl:<endpoint>}:paid
ARGV
  1 this step: "<tenant>|<run id>:<version>"
  2 the turn's tokens (its worst case)
  3 the longest wait the run can take (ms)
  4 the next step, if this one is deferred: "<tenant>|<run id>:<version + 1>"
Returns
  {"go", ""}                 draw taken (or paid before): the turn runs now
  {"wait", ms, which}        deferred: the next step may go in `ms`; `which` limit said so
                             ("rpm", "tpm", "429", or "tenant.rpm", ... for the tenant's own)
  {"late", ms, which}        the wait would outlast the run's deadline: nothing drawn
]]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local tokens, longest = tonumber(ARGV[2]), tonumber(ARGV[3])
-- A paid step of a run that ended meanwhile is forgotten after a day.
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now - 86400000)

local buckets = {}
local endpoint = rl_read(KEYS[1], now)
if endpoint then
  buckets[#buckets + 1] = {endpoint, ''}
end
local own = rl_read(KEYS[2], now)
if own then
  buckets[#buckets + 1] = {own, 'tenant.'}
end

local paid = redis.call('ZSCORE', KEYS[3], ARGV[1])
if paid then
  redis.call('ZREM', KEYS[3], ARGV[1])
  local blocked = endpoint and endpoint.blocked or 0
  if blocked <= now then
    return {'go', ''}
  end
  if blocked - now > longest then
    return {'late', blocked - now, '429'}
  end
  redis.call('ZADD', KEYS[3], blocked, ARGV[4])
  return {'wait', blocked - now, '429'}
end

local wait, which = 0, ''
for _, entry in ipairs(buckets) do
  local w, name = rl_wait(entry[1], tokens, now)
  if w > wait then
    wait, which = w, entry[2] .. name
  end
end
if wait > longest then
  return {'late', wait, which}
end
for _, entry in ipairs(buckets) do
  rl_take(entry[1], tokens)
  rl_write(entry[1], now)
end
if wait == 0 then
  return {'go', ''}
end
redis.call('ZADD', KEYS[3], now + wait, ARGV[4])
return {'wait', wait, which}
