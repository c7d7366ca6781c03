--[[
A model endpoint's token buckets, shared by rl_draw.lua and rl_adjust.lua. A bucket is a hash
(see keys.rate_bucket): the limits `rpm` and `tpm` (either may be absent: no limit on it), the
levels `r` (requests) and `t` (tokens), `at` (ms: when they were last refilled) and `blocked`
(ms: until when the provider asked to be left alone, after a 429). A bucket holds at most one
minute's worth and refills continuously at its limit per minute; a level may go below zero:
a deferred turn draws when it is deferred, and the debt is what later turns wait out.
]]
local function rl_read(key, now)
  local f = redis.call('HMGET', key, 'rpm', 'tpm', 'r', 't', 'at', 'blocked')
  local b = {key = key, rpm = tonumber(f[1] or ''), tpm = tonumber(f[2] or '')}
  if not b.rpm and not b.tpm then
    return nil
  end
  local at = tonumber(f[5] or '') or now
  local elapsed = math.max(0, now - at)
  if b.rpm then
    b.r = math.min(b.rpm, (tonumber(f[3] or '') or b.rpm) + elapsed * b.rpm / 60000)
  end
  if b.tpm then
    b.t = math.min(b.tpm, (tonumber(f[4] or '') or b.tpm) + elapsed * b.tpm / 60000)
  end
  b.blocked = tonumber(f[6] or '') or 0
  return b
end

local function rl_write(b, now)
  redis.call('HSET', b.key, 'at', string.format('%d', now))
  if b.rpm then
    redis.call('HSET', b.key, 'r', tostring(b.r))
  end
  if b.tpm then
    redis.call('HSET', b.key, 't', tostring(b.t))
  end
end

-- How long (ms) until the bucket has `tokens` tokens and one request, and which limit says so:
-- "rpm", "tpm" or "429" (while the provider's own wait runs).
local function rl_wait(b, tokens, now)
  local wait, which = 0, ''
  if b.rpm and b.r < 1 then
    wait, which = math.ceil((1 - b.r) * 60000 / b.rpm), 'rpm'
  end
  if b.tpm then
    local need = math.min(tokens, b.tpm)  -- a turn larger than a minute's tokens: a full bucket
    if b.t < need then
      local w = math.ceil((need - b.t) * 60000 / b.tpm)
      if w > wait then
        wait, which = w, 'tpm'
      end
    end
  end
  if b.blocked > now then  -- the provider's wait, and the debt it left: the 429 says so
    wait, which = math.max(wait, b.blocked - now), '429'
  end
  return wait, which
end

local function rl_take(b, tokens)
  if b.rpm then
    b.r = b.r - 1
  end
  if b.tpm then
    b.t = b.t - math.min(tokens, b.tpm)
  end
end
