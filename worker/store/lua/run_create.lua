--[[
Create a run, once. Idempotent on the run id: a second create with the same fingerprint is a
no-op that says so; with another fingerprint it is refused and nothing changes.

A run of a conversation (KEYS 6-11 and ARGV 12-20 given) also claims the conversation here, in
the same script, so that a conversation has at most one active run (running, suspended or
parked) whatever the duplicates and the kills: with no active run, this run becomes it; with
one, the submission's policy decides. The caller names the active run it read (and the run a
follow-up goes to), so that every key is declared: when the conversation has moved on since,
nothing is written and the reply says so (the caller reads again and retries).
  reject     nothing is written; the reply names the active run
  enqueue    the run is created `waiting`, at the end of the conversation's waiting list
  interrupt  the run is created `waiting`, at the front of the list, and the active run is
             marked (`supersede_by`): it ends `superseded` at its next turn boundary, and its
             end starts the first waiting run (run_commit.lua)
  merge      no run is created: the follow-up is appended to the target run's `followups`
             (the active run, or the run that interrupts it), which its next turn sees and its
             commit consumes; an idempotent submission leaves a marker, so a retry finds it

KEYS
  1 run hash        turnstile:{T}:run:<id>
  2 events stream   turnstile:{T}:events:<id>
  3 runs zset       turnstile:{T}:runs           run id -> created (ms)
  4 status set      turnstile:{T}:status:running
  5 leases zset     turnstile:{T}:leases         run id -> when its lease lapses (ms)
  6 conversation    turnstile:{T}:conv:<key>             (a run of a conversation only)
  7 waiting list    turnstile:{T}:conv-waiting:<key>
  8 active run      turnstile:{T}:run:<active id>  the active run read by the caller (any
                    run key of the tenant's when it read none)
  9 target run      turnstile:{T}:run:<target id>  where a follow-up goes (the active run, or
                    the run marked to supersede it)
  10 its events     turnstile:{T}:events:<target id>
  11 waiting set    turnstile:{T}:status:waiting
ARGV
  1 run id
  2 state JSON (schema-versioned, from the kernel)
  3 fingerprint of the submission (tenant, user, job, goal, params, budget, queue)
  4 queue
  5 job
  6 user id
  7 pickup lease (ms): how long the first step has to start before the sweeper re-sends it
  8 the "submitted" event, JSON
  9 events stream max length
  10 the first turn's ledger hold, JSON (see run_load.lua)
  11 the run's priority (0-9; fair share takes a tenant's higher ones first, see fair_lib.lua)
  12 the conversation key, or nothing at all (then ARGV 13-20 and KEYS 6-11 are absent)
  13 the policy: reject, enqueue, interrupt or merge
  14 the active run id the caller read, or ""
  15 the target run id the caller read (a follow-up's), or ""
  16 the state JSON of the run as a waiting one (enqueue, interrupt)
  17 the follow-up JSON (merge): {"text", "at", "id"}; the event on the target run, JSON
     (merge: "followup"; interrupt: "interrupt_requested") is ARGV 18
  18 that event
  19 "1" when the submission is idempotent (a merge leaves its marker), else ""
  20 the most follow-ups a run may have waiting
Returns
  {"created", now_ms} or {"exists", fingerprint}
  {"busy", active}                    reject: the conversation has an active run
  {"waiting", active, now_ms}         enqueue: created waiting
  {"interrupting", active, now_ms}    interrupt: created waiting, the active run marked
  {"merged", target, again}           merge: appended (again: "1" when a retry found it)
  {"moved", active, target}           the conversation is not as the caller read it
  {"full", target}                    the target has the most follow-ups waiting already
]]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local conversation = ARGV[12] or ''
local existing = redis.call('HGET', KEYS[1], 'fingerprint')
if existing then
  return {'exists', existing}
end

local function create(status, state, status_key, lease)
  redis.call('HSET', KEYS[1],
    'state', state, 'version', 1, 'status', status, 'fingerprint', ARGV[3],
    'queue', ARGV[4], 'job', ARGV[5], 'user', ARGV[6],
    'created_ms', string.format('%d', now), 'updated_ms', string.format('%d', now),
    'hold', ARGV[10], 'priority', ARGV[11])
  if conversation ~= '' then
    redis.call('HSET', KEYS[1], 'conversation', conversation)
  end
  redis.call('ZADD', KEYS[3], now, ARGV[1])
  redis.call('SADD', status_key, ARGV[1])
  if lease then
    redis.call('ZADD', KEYS[5], now + tonumber(ARGV[7]), ARGV[1])
  end
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[9], '*', 'event', ARGV[8])
end

if conversation == '' then
  create('running', ARGV[2], KEYS[4], true)
  return {'created', string.format('%d', now)}
end

local policy, expected, expected_target = ARGV[13], ARGV[14], ARGV[15]
local marker = 'm:' .. ARGV[1]
local merged = redis.call('HGET', KEYS[6], marker)
if merged then  -- an idempotent merge made before: where it went
  local target, fp = string.match(merged, '^([^|]*)|(.*)$')
  if fp ~= ARGV[3] then
    return {'exists', fp}
  end
  return {'merged', target, '1'}
end
local active = redis.call('HGET', KEYS[6], 'active') or ''
if active ~= '' then
  -- A run that ended releases the conversation in the same script; one found ended (or gone)
  -- anyway no longer holds it.
  local status = active == expected and redis.call('HGET', KEYS[8], 'status') or nil
  if active == expected and (not status or status == 'stopped') then
    redis.call('HDEL', KEYS[6], 'active')
    active = ''
  end
end
if active ~= expected then
  return {'moved', active, ''}
end
if active == '' then
  redis.call('HSET', KEYS[6], 'active', ARGV[1])
  create('running', ARGV[2], KEYS[4], true)
  return {'created', string.format('%d', now)}
end

if policy == 'reject' then
  return {'busy', active}
end
if policy == 'enqueue' then
  create('waiting', ARGV[16], KEYS[11], false)
  redis.call('RPUSH', KEYS[7], ARGV[1])
  return {'waiting', active, string.format('%d', now)}
end
if policy == 'interrupt' then
  create('waiting', ARGV[16], KEYS[11], false)
  redis.call('LPUSH', KEYS[7], ARGV[1])
  redis.call('HSET', KEYS[8], 'supersede_by', ARGV[1])
  redis.call('XADD', KEYS[10], 'MAXLEN', '~', ARGV[9], '*', 'event', ARGV[18])
  return {'interrupting', active, string.format('%d', now)}
end
-- merge: into the run that supersedes the active one, if it is marked, else the active one
local target = redis.call('HGET', KEYS[8], 'supersede_by') or active
if target ~= expected_target then
  return {'moved', active, target}
end
local waiting = cjson.decode(redis.call('HGET', KEYS[9], 'followups') or '[]')
if #waiting >= tonumber(ARGV[20]) then
  return {'full', target}
end
local followups = redis.call('HGET', KEYS[9], 'followups')
if followups and followups ~= '[]' then
  followups = string.sub(followups, 1, -2) .. ',' .. ARGV[17] .. ']'
else
  followups = '[' .. ARGV[17] .. ']'
end
redis.call('HSET', KEYS[9], 'followups', followups)
redis.call('XADD', KEYS[10], 'MAXLEN', '~', ARGV[9], '*', 'event', ARGV[18])
if ARGV[19] == '1' then
  redis.call('HSET', KEYS[6], marker, target .. '|' .. ARGV[3])
end
return {'merged', target, '0'}
