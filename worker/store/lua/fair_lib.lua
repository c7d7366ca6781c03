--[[
Fair share's pending lists, shared by fair_push.lua (a step sent by a client, the sweeper or
resume), fair_take.lua (the dispatcher's take) and run_commit.lua (the next step of a run,
queued by the very commit that makes it due, so no crash can fall between the two; and the
eager claim's check).

A tenant's pending steps on a queue are two sorted sets in its hash slot, continuations and
first steps apart. An entry's score is its run's priority level's band (`FAIR_BAND` wide, the
highest priority lowest) plus the time it was queued (ms): within a level, the oldest first,
and each level's oldest entry is found in O(log n).

Which level goes next (`fair_next`): a waiting step's effective priority is its run's priority
plus one level per `aging_ms` it has waited. A level's effective priority is that of its
oldest step (of either kind); the highest goes first (a tie: the higher priority). Within the
level its continuations go before its first steps, each oldest first. As every waiting step
ages at the same rate, comparing "queued at - priority x aging_ms" (lowest first) is comparing
effective priorities now.
]]
local FAIR_BAND = 4398046511104  -- 2^42 ms, 139 years: one priority level's scores
local FAIR_DEFAULT_PRIORITY = 5  -- a run stored without one (worker/scheduling/priority.py)

local function fair_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- A run's priority (0-9) from its hash's field `priority` as read (nil: none).
local function fair_priority_of(raw)
  local p = tonumber(raw or '')
  if p == nil or p ~= math.floor(p) or p < 0 or p > 9 then
    return FAIR_DEFAULT_PRIORITY
  end
  return p
end

-- The run's priority (0-9) as its hash holds it.
local function fair_priority(run)
  return fair_priority_of(redis.call('HGET', run, 'priority'))
end

--[[
Queue a step entry in its tenant's pending set, unless the same run's step of the same
version waits there already (the sweeper re-sending a step that is only waiting its turn); and
give back the slot of the run's step before it, whose delivery sends this one (so a continuing
run's slot changes hands in the same round trip). Every key is in the tenant's slot.

  pending   turnstile:{T}:waiting:<queue>:cont|start   (sorted set, see above)
  index     turnstile:{T}:waiting-index     run id -> version waiting
  slots     turnstile:{T}:slots
  run       turnstile:{T}:run:<id>          its `priority`
  before    the slot to give back ("<run id>:<version - 1>"), or ""
Returns 1 if queued, 0 if that step was waiting already.
]]
local function fair_queue(pending, index, slots, run, run_id, version, entry, before)
  if before ~= '' then
    redis.call('ZREM', slots, before)
  end
  if redis.call('HGET', index, run_id) == version then
    return 0
  end
  redis.call('HSET', index, run_id, version)
  local score = (9 - fair_priority(run)) * FAIR_BAND + fair_now()
  redis.call('ZADD', pending, string.format('%d', score), entry)
  return 1
end

-- The oldest entry of priority level p in a pending set, and when it was queued (ms); nil if
-- the level has none.
local function fair_oldest(pending, p)
  local low = (9 - p) * FAIR_BAND
  local got = redis.call('ZRANGEBYSCORE', pending, string.format('%d', low),
    '(' .. string.format('%d', low + FAIR_BAND), 'WITHSCORES', 'LIMIT', 0, 1)
  if #got == 0 then
    return nil
  end
  return got[1], tonumber(got[2]) - low
end

-- The priority levels a pending set holds, from its first and last entries: highest, lowest
-- (nil, nil for an empty set).
local function fair_span(pending)
  local first = redis.call('ZRANGE', pending, 0, 0, 'WITHSCORES')
  if #first == 0 then
    return nil, nil
  end
  local last = redis.call('ZRANGE', pending, -1, -1, 'WITHSCORES')
  local high = 9 - math.floor(tonumber(first[2]) / FAIR_BAND)
  return high, 9 - math.floor(tonumber(last[2]) / FAIR_BAND)
end

-- The levels of a tenant's pending sets on a queue (first steps only if `starts`), each as
-- {p, queued ms of its oldest step, its oldest continuation, its oldest first step}, highest
-- first, for `fair_next` and run_commit.lua's eager check. Only the levels between the
-- highest and the lowest held are read (one, when every run has the same priority).
local function fair_levels(cont, start, starts)
  local levels = {}
  local c_high, c_low = fair_span(cont)
  local s_high, s_low
  if starts then
    s_high, s_low = fair_span(start)
  end
  local has_cont, has_start = c_high ~= nil, s_high ~= nil
  if not has_cont and not has_start then
    return levels
  end
  local high = math.max(c_high or -1, s_high or -1)
  local low = math.min(c_low or 10, s_low or 10)
  for p = high, low, -1 do
    local c, c_at, s, s_at
    if has_cont then
      c, c_at = fair_oldest(cont, p)
    end
    if has_start then
      s, s_at = fair_oldest(start, p)
    end
    local at = c_at
    if s_at and (not at or s_at < at) then
      at = s_at
    end
    if at then
      levels[#levels + 1] = {p, at, c, s}
    end
  end
  return levels
end

-- The entry fair share takes next from a tenant's pending sets on a queue (first steps only
-- if `starts`): its set, its entry and its run's priority; nil when nothing may go.
local function fair_next(cont, start, starts, aging_ms)
  local best, best_score
  for _, level in ipairs(fair_levels(cont, start, starts)) do
    local score = level[2] - level[1] * aging_ms
    if not best_score or score < best_score then  -- levels come highest first: a tie keeps it
      best, best_score = level, score
    end
  end
  if not best then
    return nil
  end
  if best[3] then
    return cont, best[3], best[1]
  end
  return start, best[4], best[1]
end

--[[
A step sent to the broker and not yet loaded (the queue's fair_sent set, see keys.py): its
member names the step ("<tenant>|<run id>:<version>", which its load removes), its score is
when it was sent (ms) plus (its run's priority + 1) / 16, so an eager claim can tell which
sent steps outrank it. The fraction is exact in a double for any time in ms (2^41 + 4 bits),
and a whole score, from a dispatcher that did not say, reads as outranking every priority
(pending.py `sent_score` writes it).
]]
local function fair_sent_priority(score)
  local p = math.floor((score - math.floor(score)) * 16 + 0.5) - 1
  if p < 0 or p > 9 then
    return 10
  end
  return p
end
