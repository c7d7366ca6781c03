--[[
Correct a model endpoint's buckets after a call (this body follows rl_lib.lua): give back the
tokens a turn drew and did not use (a negative number takes more), or, after a 429, shrink the
endpoint's bucket for every worker until the provider's window passes: nothing goes before
`blocked`, and the levels are lowered so that one request may go then, and the bucket refills
at its pace after it.

KEYS
  1 endpoint bucket   turnstile:{rl:<endpoint>}:bucket
  2 tenant bucket     turnstile:{rl:<endpoint>}:tenant:<tenant>   (only for a refund)
ARGV
  1 "refund" or "block"
  2 refund: the tokens to give back; block: the provider's wait (ms)
Returns the endpoint's `blocked` (ms), or 0 when it has no limits
]]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local amount = tonumber(ARGV[2])
local endpoint = rl_read(KEYS[1], now)
if ARGV[1] == 'block' then
  if not endpoint then
    return 0
  end
  local until_ms = now + amount
  if until_ms > endpoint.blocked then
    redis.call('HSET', KEYS[1], 'blocked', string.format('%d', until_ms))
    endpoint.blocked = until_ms
  end
  -- What refills during the window is owed already: one request when the window ends, and
  -- no tokens, then the bucket refills at its pace.
  if endpoint.rpm then
    endpoint.r = math.min(endpoint.r, 1 - amount * endpoint.rrate)
  end
  if endpoint.tpm then
    endpoint.t = math.min(endpoint.t, -amount * endpoint.trate)
  end
  rl_write(endpoint, now)
  return endpoint.blocked
end
for _, b in ipairs({endpoint or false, rl_read(KEYS[2], now) or false}) do
  if b and b.tpm then
    b.t = math.min(b.tcap, b.t + amount)
    rl_write(b, now)
  end
end
return endpoint and endpoint.blocked or 0
