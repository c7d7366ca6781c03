--[[
Commit one change of a run, atomically: compare-and-set the version, write the state and its
summary fields, settle the turn's ledger reservations, close every other hold the run still
has open, append the events, move the run in the status and outcome indexes, and set or clear
its lease. Used for every change a run goes through: a turn, a park, a decision, a failure.
This body follows the ledger's library (see ledger/lib.lua), fair_lib.lua and run_lib.lua, so
`ledger_settle_at`, `ledger_settle_check`, `fair_queue`, `fair_levels` and `run_load_at` are in
scope.

The next step: with fair share on, a commit that leaves the run running also queues the run's
next step in its tenant's pending list (`fair_queue`), in the same script: the step is queued
if and only if the compare-and-set wins, and no crash can fall between the commit and the
enqueue.

Eager continuation: a commit that would queue the next step may instead claim it for the
committing worker (which asks only when it is free to run it at once: see runtime/task.py),
when fair share would pick this run anyway: no other tenant has steps pending on the queue
(KEYS 20) or sent to the broker and not yet loaded (KEYS 21, entries younger than the window),
no continuation of the tenant's of a higher priority is sent and not loaded, no step of the
tenant's waits in its pending sets on the queue that fair share would take before this one
(KEYS 14 and 24: one of a higher effective priority, or a continuation of the same priority;
see fair_lib.lua), the tenant is under its cap on turns in flight, and neither the tenant nor
the queue is paused or draining (the tenant's first steps of the same priority wait: fair
share sends a level's continuations before its first steps).
The tenant's own sent continuations of the same or a lower priority do not stop a claim: they
hold their slots already and wait only for a worker to read them, so the run that is here goes
on (as a sticky worker would), at most the delivery's chain of turns, while fair share's order
over the steps still waiting is kept. A sent step's priority is in its score (fair_lib.lua,
`fair_sent_priority`).
The claimed step takes the slot the queued one would (the previous step's is given back),
then is loaded here, by the very function run_load.lua runs (`run_load_at`), with its
in-flight lease, attempt token and ledger hold: the worker runs that turn at once, and a
worker that dies before the turn commits leaves a lease that lapses, as for any delivery.

Cluster: the queue's keys (KEYS 19-23) are in no tenant's slot, so on a Valkey/Redis Cluster a
script cannot read them with the tenant's (the tenant's pending set of first steps, KEYS 24,
then comes as KEYS 19). There the caller reads the queue's part of the check (its flags,
fair_active, fair_sent) just before the commit, and asks to claim only if it passed, saying
the highest priority of the tenant's sent continuations; the script then takes KEYS 1-19
only, checks the tenant's part (that priority against the run's, its pause, its pending steps
that outrank this one, its cap) as above, and a step it queues after all is announced by the
caller, after the reply. The check is about fairness only: a claim the read let through a
moment too late runs one turn early, never twice (the version and the in-flight lease see to
that).

Holds: every hold taken for the version being replaced is in the run's field `holds` (see
run_load.lua and run_hold.lua). The settlements listed here are checked all together first
(`ledger_settle_check`): if any would be refused nothing at all is written. Then each is
settled, and every other open hold (one a killed delivery took, one a turn took before a
cancel or a failure overtook it) is released, so a run never leaves a hold behind to expire
and be charged in full. A hold already resolved, or unknown to the ledger, is left as it is.

KEYS
  1 run hash        turnstile:{T}:run:<id>
  2 events stream   turnstile:{T}:events:<id>
  3 leases zset     turnstile:{T}:leases
  4 old status set  turnstile:{T}:status:<status the caller loaded>
  5 new status set  turnstile:{T}:status:<new status>
  6 outcome set     turnstile:{T}:outcome:<outcome> (any tenant key when there is none)
  7 inflight hash   turnstile:{T}:inflight
  8-13              the tenant's six ledger keys, in the library's order
  14-16             to queue the next step: its pending set (continuations), the pending
                    index, the slots (its priority is KEYS 1's)
  then, for a stopping commit of a run of a conversation (instead of 14-24, which only a run
  that goes on uses), from the index ARGV names: the conversation hash, its waiting list, the
  first waiting run's hash and its events stream (any run key of the tenant's when none waits),
  the waiting and the running status sets
  17-24             to claim it (eager): the tenant's control hash, its caps hash (on a
                    cluster, only these two and the tenant's pending set of first steps as
                    KEYS 19: see "Cluster"), the queue's control hash, the queue's pending
                    tenants (fair_active), the
                    queue's sent steps (fair_sent), the set of queues with pending steps,
                    the dispatcher's wake-up list (to announce a step queued after all), the
                    tenant's pending set of first steps on the queue
  last              when claiming: the run's live readers (run_load.lua's KEYS 11), for the
                    claimed step's load
  last two          when giving the step's slot back (see ARGV): the tenant's slots and its
                    active runs (the caller then nudges the dispatcher in the same round trip)
ARGV
  One MessagePack array of strings (`run_calls.packed`): one value for the client to send
  instead of about a hundred, unpacked here into the arguments below, numbered from 1.
  1 run id
  2 expected version
  3 new state JSON, or "" to keep the stored one (a state that no longer parses)
  4 new status
  5 outcome or ""
  6 detail or ""
  7 reason or ""
  8 lease (ms) from now, or "" to drop the lease (stopped, suspended, parked)
  9 events stream max length
  10 n: the number of events, then n event JSON strings
  then m: the number of settlements, then for each: k, then its k ledger_settle arguments
  then h: the number of run-hash fields to delete, then their names
  then the next turn's ledger hold (see run_load.lua): "" keeps it, "-" drops it, else its JSON
  then "1" to commit only if no turn of the run is in flight (its in-flight lease is live), or ""
  then the ledger's journal max length (for the releases)
  then the step's fair-share slot ("<run id>:<version>") to give back with this commit (a run
  that stops, parks or suspends, fair share on: KEYS' last two are then the tenant's slots
  and active runs), or ""
  then the number of follow-ups the change consumed (the first n of field `followups`: the
  ones its turn's load read; merges only append), the index in KEYS of the conversation's keys
  (a stopping commit of a run of a conversation) or "", the conversation's first waiting run
  as the caller read it (or ""), the pickup lease (ms) it starts with and its "started" event
  then, to queue the next step (KEYS 14-16): its entry (JSON, for the new version) and the
  slot to give back, else nothing
  then, to claim it instead where it may be (KEYS 17-24): the tenant, the in-flight lease (ms),
  where the turn runs ("<queue>|<pid>|<host>"), the claimed delivery's token, the window of
  sent steps (ms), the claimed step's slot lease (ms), the queue, "1" on a cluster (see
  "Cluster") or "", the priority aging (ms), and on a cluster the highest priority of the
  tenant's continuations sent and not loaded (-1: none); else nothing. A commit that asked to claim
  and queued instead announces the step itself (see fair.Pending.announce, which the caller
  pipelines after a commit that did not ask), so a claimed step adds its tenant to no set of
  tenants with work.
Conversations: a commit that stops the active run of a conversation releases it in the same
script: its first waiting run (enqueued, or interrupting at the front) becomes the active one,
`running`, with a pickup lease (the caller sends its first step; the sweeper does when the
caller does not), or the conversation is left with no active run. A waiting run that stops
(cancelled) leaves the waiting list. When the first waiting run is not the one the caller read
(one more interrupt came in between), nothing is written and the reply says so. Follow-ups the
turn saw are consumed here, compare-and-set with the version like the state that now holds
them; a run that stops with follow-ups it never saw says so in its events (`followups_unseen`).

Returns
  {"ok", new_version, queued, run, queue, state} (a waiting run of the conversation started: its
  id, queue and state) | {"moved", first waiting run} (nothing written) |
  {"ok", new_version, queued} (queued: 1 if the next step was queued, 0 if not asked or it
  was waiting already) | {"ok", new_version, 2, load} (the step was claimed: `load` is
  run_load.lua's reply for it) | {"stale", version} | {"missing"} | {"ledger", outcome, detail}
  | {"busy", version} (a turn is in flight and the change asked for none: nothing written)
]]
-- The arguments, as the caller packed them (see ARGV above): from here on ARGV is that array.
local ARGV = cmsgpack.unpack(ARGV[1])

-- The tenant's part of the check: no continuation of its waits, and it is under its cap.
local function tenant_may_claim(claim, give_back, now, mine)
  if claim.split and claim.sent_top > mine then
    return false  -- a sent continuation of the tenant's outranks this one (the caller read it)
  end
  -- The tenant's own pending steps on the queue: the claim is fair share's next pick only if
  -- no waiting step outranks this one (fair_lib.lua's order, with this step queued now).
  local levels = fair_levels(KEYS[14], claim.starts, true)
  local oldest = now  -- its level's oldest step: this one, or a first step waiting longer
  for _, level in ipairs(levels) do
    if level[1] == mine then
      if level[3] then
        return false  -- a continuation of the same priority waits: it goes first
      end
      oldest = math.min(oldest, level[2])
    end
  end
  local mine_score = oldest - mine * claim.aging
  for _, level in ipairs(levels) do
    local p, score = level[1], level[2] - level[1] * claim.aging
    if p ~= mine and (score < mine_score or (score == mine_score and p > mine)) then
      return false  -- a level of a higher effective priority waits: it goes first
    end
  end
  local cap = tonumber(redis.call('HGET', KEYS[18], 'turns_in_flight') or '')
  if cap then
    redis.call('ZREMRANGEBYSCORE', KEYS[16], '-inf', now)
    local held = redis.call('ZCARD', KEYS[16])
    if give_back ~= '' and redis.call('ZSCORE', KEYS[16], give_back) then
      held = held - 1
    end
    if held + 1 > cap then
      return false
    end
  end
  return true
end

-- Whether fair share would pick this run's next step anyway (see "Eager continuation").
local function may_claim(claim, give_back, now)
  if (redis.call('HGET', KEYS[17], 'paused') or '') ~= '' then
    return false
  end
  local mine = claim.priority
  if claim.split then
    return tenant_may_claim(claim, give_back, now, mine)  -- the caller read the queue's part
  end
  local flags = redis.call('HMGET', KEYS[19], 'paused', 'draining')
  if (flags[1] or '') ~= '' or (flags[2] or '') ~= '' then
    return false
  end
  for _, tenant in ipairs(redis.call('SMEMBERS', KEYS[20])) do
    if tenant ~= claim.tenant then
      return false
    end
  end
  local sent = redis.call('ZRANGEBYSCORE', KEYS[21], now - claim.window, '+inf', 'WITHSCORES',
    'LIMIT', 0, 257)
  if #sent > 512 then
    return false
  end
  local own = claim.tenant .. '|'
  for i = 1, #sent, 2 do
    local entry = sent[i]
    -- Another tenant's step: its turn comes first. This tenant's own sent steps hold their
    -- slots already and wait only for a worker: its first steps come after its continuations
    -- anyway, and this run goes on past its sent continuations of no higher priority (see
    -- "Eager continuation").
    if string.sub(entry, 1, #own) ~= own then
      return false
    end
    local continuation = string.match(entry, ':(%d+)$') ~= '1'
    if continuation and fair_sent_priority(tonumber(sent[i + 1])) > mine then
      return false
    end
  end
  return tenant_may_claim(claim, give_back, now, mine)
end

local version, open, priority = unpack(redis.call('HMGET', KEYS[1], 'version', 'holds',
  'priority'))
if not version then
  return {'missing'}
end
if version ~= ARGV[2] then
  return {'stale', version}
end

local i = 10
local n_events = tonumber(ARGV[i])
local events_at = i + 1
i = i + n_events + 1
local n_settles = tonumber(ARGV[i])
i = i + 1
local settles = {}
for s = 1, n_settles do
  local k = tonumber(ARGV[i])
  local argv = {}
  for j = 1, k do
    argv[j] = ARGV[i + j]
  end
  settles[s] = argv
  i = i + k + 1
end
local n_hdel = tonumber(ARGV[i])
local hdel_at = i + 1
i = i + n_hdel + 1
local hold, if_idle, maxlen = ARGV[i] or '', ARGV[i + 1] or '', ARGV[i + 2] or '1000'
local slot = ARGV[i + 3] or ''
i = i + 1
-- Conversations (see "Conversations" above): follow-ups seen, and the release's keys.
local seen, conv_at = tonumber(ARGV[i + 3] or '') or 0, tonumber(ARGV[i + 4] or '')
local expected_head, conv_lease, started_event = ARGV[i + 5] or '', ARGV[i + 6], ARGV[i + 7]
i = i + 5
local next_entry, give_back = ARGV[i + 3] or '', ARGV[i + 4] or ''
local claimer = ARGV[i + 5] or ''

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if if_idle == '1' then
  local running = redis.call('HGET', KEYS[7], ARGV[1])
  if running and tonumber(string.match(running, '|(%d+)$') or '0') > now then
    return {'busy', version}
  end
end

local releasing, head = false, nil
if conv_at and ARGV[4] == 'stopped' then
  releasing = redis.call('HGET', KEYS[conv_at], 'active') == ARGV[1]
  head = releasing and redis.call('LINDEX', KEYS[conv_at + 1], 0) or nil
  if releasing and (head or '') ~= expected_head then
    return {'moved', head or ''}
  end
end

local ledger_keys = {KEYS[8], KEYS[9], KEYS[10], KEYS[11], KEYS[12], KEYS[13]}
-- The ledger's due expiries, charged once at this commit's `now`, before its first ledger
-- change (each change would otherwise look again, at the same time, with a read of its own).
local expired = false
local function ledger_due()
  if not expired then
    ledger_expire_due(ledger_keys, now, LEDGER_EXPIRE_BATCH, maxlen)
    expired = true
  end
  return true
end
for s = 1, n_settles do
  local refusal = ledger_settle_check(ledger_keys, settles[s])
  if refusal then
    -- Nothing of the run or the ledger is written.
    return {'ledger', refusal[1], tostring(refusal[2] or '')}
  end
end
local settled = {}
for s = 1, n_settles do
  ledger_settle_at(ledger_keys, settles[s], now, 'settle', ledger_due())
  settled[settles[s][1]] = true
end
for id in string.gmatch(open or '', '%S+') do
  if not settled[id] then
    local argv = {id, maxlen}
    if not ledger_settle_check(ledger_keys, argv) then
      ledger_settle_at(ledger_keys, argv, now, 'release', ledger_due())
    end
  end
end

-- Whether the next step is claimed (see "Eager continuation"): decided before the run's
-- writes, which the check does not read, so that the claimed load's writes are not made twice.
local claim, claiming = nil, false
if next_entry ~= '' and claimer ~= '' then
  claim = {
    tenant = claimer, lease = ARGV[i + 6], where = ARGV[i + 7], token = ARGV[i + 8],
    window = tonumber(ARGV[i + 9]), slot_lease = tonumber(ARGV[i + 10]), queue = ARGV[i + 11],
    split = ARGV[i + 12] == '1', aging = tonumber(ARGV[i + 13]),
    sent_top = tonumber(ARGV[i + 14] or '') or 10, priority = fair_priority_of(priority),
  }
  claim.starts = claim.split and KEYS[19] or KEYS[24]
  claiming = may_claim(claim, give_back, now)
end

-- The run's hash: the fields cleared (its open holds, now settled or released; the caller's;
-- the next hold, when dropped), then the fields written, one command each.
local gone = {'holds'}
for j = 0, n_hdel - 1 do
  gone[#gone + 1] = ARGV[hdel_at + j]
end
if hold == '-' then
  gone[#gone + 1] = 'hold'
end
redis.call('HDEL', KEYS[1], unpack(gone))
local new_version = tonumber(version) + 1
local run_id, status, outcome = ARGV[1], ARGV[4], ARGV[5]
local written = {'version', new_version, 'status', status, 'outcome', outcome,
  'detail', ARGV[6], 'reason', ARGV[7], 'updated_ms', string.format('%d', now)}
if hold ~= '' and hold ~= '-' then
  written[#written + 1], written[#written + 2] = 'hold', hold
end
if ARGV[3] ~= '' then
  written[#written + 1], written[#written + 2] = 'state', ARGV[3]
end
redis.call('HSET', KEYS[1], unpack(written))
for j = 0, n_events - 1 do
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[9], '*', 'event', ARGV[events_at + j])
end
if KEYS[4] ~= KEYS[5] then
  redis.call('SREM', KEYS[4], run_id)
end
redis.call('SADD', KEYS[5], run_id)
if outcome ~= '' and status == 'stopped' then
  redis.call('SADD', KEYS[6], run_id)
end
if ARGV[8] == '' then
  redis.call('ZREM', KEYS[3], run_id)
elseif not claiming then  -- a claimed step's load sets its in-flight lease
  redis.call('ZADD', KEYS[3], now + tonumber(ARGV[8]), run_id)
end
redis.call('HDEL', KEYS[7], run_id)
if slot ~= '' then
  -- The step's delivery is done: its fair-share slot back, and a run that stopped leaves the
  -- tenant's active runs (what the worker would otherwise do in a round trip of its own).
  redis.call('ZREM', KEYS[#KEYS - 1], slot)
  if status == 'stopped' then
    redis.call('ZREM', KEYS[#KEYS], run_id)
  end
end
if seen > 0 then
  local rest = cjson.decode(redis.call('HGET', KEYS[1], 'followups') or '[]')
  local kept = {}
  for j = seen + 1, #rest do
    kept[#kept + 1] = rest[j]
  end
  if #kept == 0 then
    redis.call('HDEL', KEYS[1], 'followups')
  else
    redis.call('HSET', KEYS[1], 'followups', cjson.encode(kept))
  end
end
if status == 'stopped' then
  local unseen = redis.call('HGET', KEYS[1], 'followups')
  if unseen and unseen ~= '[]' then
    redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[9], '*', 'event',
      '{"followups":' .. unseen .. ',"type":"followups_unseen"}')
  end
end
if conv_at and status == 'stopped' then
  redis.call('LREM', KEYS[conv_at + 1], 0, run_id)  -- a waiting run that ends leaves the list
  if releasing and head then
    redis.call('LPOP', KEYS[conv_at + 1])
    local fields = redis.call('HMGET', KEYS[conv_at + 2], 'status', 'queue', 'state')
    if fields[1] == 'waiting' then
      redis.call('HSET', KEYS[conv_at], 'active', head)
      redis.call('HSET', KEYS[conv_at + 2], 'status', 'running', 'updated_ms',
        string.format('%d', now))
      redis.call('SREM', KEYS[conv_at + 4], head)
      redis.call('SADD', KEYS[conv_at + 5], head)
      redis.call('ZADD', KEYS[3], now + tonumber(conv_lease), head)
      redis.call('XADD', KEYS[conv_at + 3], 'MAXLEN', '~', ARGV[9], '*', 'event', started_event)
      return {'ok', new_version, 0, head, fields[2], fields[3]}
    end
    redis.call('HDEL', KEYS[conv_at], 'active')
  elseif releasing then
    redis.call('HDEL', KEYS[conv_at], 'active')
  end
end
local queued = 0
if claiming then
  if give_back ~= '' then
    redis.call('ZREM', KEYS[16], give_back)
  end
  redis.call('ZADD', KEYS[16], now + claim.slot_lease, run_id .. ':' .. new_version)
  -- The check found the tenant not paused, and the run's turn in flight was cleared above.
  local loaded = run_load_at(
    {KEYS[1], KEYS[3], KEYS[17], KEYS[7], KEYS[8], KEYS[9], KEYS[10], KEYS[11], KEYS[12],
     KEYS[13], KEYS[#KEYS]},
    {run_id, tostring(new_version), claim.lease, claim.where, claim.token, ''},
    {now = now, expired = ledger_due(), paused = '', idle = true})
  return {'ok', new_version, 2, loaded}
end
if claim then
  queued = fair_queue(KEYS[14], KEYS[15], KEYS[16], KEYS[1], run_id, tostring(new_version),
    next_entry, give_back)
  if not claim.split then
    redis.call('SADD', KEYS[20], claim.tenant)
    redis.call('SADD', KEYS[22], claim.queue)
    redis.call('LPUSH', KEYS[23], '1')
    redis.call('LTRIM', KEYS[23], 0, 0)
  end
elseif next_entry ~= '' then
  queued = fair_queue(KEYS[14], KEYS[15], KEYS[16], KEYS[1], run_id, tostring(new_version),
    next_entry, give_back)
end
return {'ok', new_version, queued}
