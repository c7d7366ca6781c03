--[[
A model endpoint's token buckets, shared by rl_draw.lua and rl_adjust.lua. A bucket is a hash
(see keys.rate_bucket): the limits `rpm` and `tpm` (either may be absent: no limit on it),
`burst_s` (how many seconds' worth of each limit may go at once; absent: RL_BURST_S), the
levels `r` (requests) and `t` (tokens), `at` (ms: when they were last refilled) and `blocked`
(ms: until when the provider asked to be left alone, after a 429).

A limit L per minute with a burst of B (L * burst_s / 60, at least one) holds at most B and
refills continuously at (L - B + 1) per (60 + RL_SLACK_S) s: B may go at once, and no window
shorter than 60 + RL_SLACK_S seconds passes more than L, so a provider that counts any 60 s
(a sliding window), each second (a per-second quantum of a small burst) or a bucket of its
own with at least B at once never sees more than its figure, with RL_SLACK_S to spare for a
request that reaches it later than another. A level may go below zero: a deferred turn draws
when it is deferred, and the debt is what later turns wait out.
]]
-- The defaults: worker/scheduling/ratelimits.py DEFAULT_BURST_S and SLACK_S say the same.
local RL_BURST_S = 1
local RL_SLACK_S = 1

-- A limit's burst (what the bucket holds) and refill (per ms).
local function rl_shape(limit, burst_s)
  local cap = math.max(1, math.floor(limit * burst_s / 60))
  if cap > limit then
    cap = limit
  end
  return cap, (limit - cap + 1) / ((60 + RL_SLACK_S) * 1000)
end

local function rl_read(key, now)
  local f = redis.call('HMGET', key, 'rpm', 'tpm', 'r', 't', 'at', 'blocked', 'burst_s')
  local b = {key = key, rpm = tonumber(f[1] or ''), tpm = tonumber(f[2] or '')}
  if not b.rpm and not b.tpm then
    return nil
  end
  local at = tonumber(f[5] or '') or now
  local elapsed = math.max(0, now - at)
  local burst_s = tonumber(f[7] or '') or RL_BURST_S
  if b.rpm then
    b.rcap, b.rrate = rl_shape(b.rpm, burst_s)
    b.r = math.min(b.rcap, (tonumber(f[3] or '') or b.rcap) + elapsed * b.rrate)
  end
  if b.tpm then
    b.tcap, b.trate = rl_shape(b.tpm, burst_s)
    b.t = math.min(b.tcap, (tonumber(f[4] or '') or b.tcap) + elapsed * b.trate)
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
    wait, which = math.ceil((1 - b.r) / b.rrate), 'rpm'
  end
  if b.tpm then
    local need = math.min(tokens, b.tcap)  -- a turn larger than the burst: a full bucket
    if b.t < need then
      local w = math.ceil((need - b.t) / b.trate)
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
  if b.tpm then  -- a turn larger than the burst goes into debt, at most a minute's worth
    b.t = b.t - math.min(tokens, b.tpm)
  end
end
