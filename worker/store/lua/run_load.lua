--[[
Load a run for one step, gate it and admit it, in one round trip: its state, if the step's
version is current and the run is live; the attempt count (a step that keeps killing its
worker is poison: see below); the in-flight lease and mark; the tenant's pause flag and any cancel
request (or a newer run of its conversation that interrupts it); the follow-ups merged into it
since its last turn; and, when the run may go on, the ledger hold for its next turn, taken here with
`ledger_reserve`. The body is `run_load_at` in run_lib.lua (which follows the ledger's
library, see ledger/lib.lua): an eager commit (run_commit.lua) loads its claimed step with it.

The hold's arguments were computed when the run last changed (field `hold`: JSON, either
{"argv": ledger_reserve's argv, "exposure": {...}} or {"unfit": dimension} when the run's own
budget does not admit another turn). Nothing is reserved for a run that is paused, cancelled
or unfit. A queue's flags are not in this slot: the caller reads them in the same pipeline and
releases the hold if the queue turns out to be paused or draining. The id of a hold taken is
added to the run's open holds (field `holds`, ids separated by spaces): the next commit settles
or releases every one of them (see run_commit.lua).

Attempts count the deliveries of this version that started a turn and may have died in it:
field `attempt_tokens` lists their delivery tokens. A delivery that exited cleanly (the store
or the ledger was down: it could not say so then) is named by its retry as `after`; that entry
is dropped, and its in-flight mark does not make the retry wait. Only deliveries that died
mid-turn are left counted.

KEYS
  1 run hash        turnstile:{T}:run:<id>
  2 leases zset     turnstile:{T}:leases
  3 control hash    turnstile:{T}:control       tenant flags
  4 inflight hash   turnstile:{T}:inflight      run id -> "<queue>|<pid>|<host>|<token>|<lease ms>"
  5-10              the tenant's six ledger keys, in the library's order
  11 live readers   turnstile:{T}:live-readers:<id>   someone reads the run's live output
ARGV
  1 run id
  2 version the step expects
  3 in-flight lease (ms)
  4 "<queue>|<pid>|<host>": where the turn runs (a drain waits for its queue's turns)
  5 this delivery's token (no spaces, no '|')
  6 the token of the earlier delivery of this step that exited cleanly, or ""
Returns
  {"missing"}
  {"stale", version, status}                  another step already moved the run on
  {"idle", version, status}                   suspended, parked or stopped: nothing to run
  {"busy", version, status}                   another delivery of this step is running it
                                              (its in-flight lease is live): one turn per
                                              version, so a duplicate never forks the run
  {"go", state, attempts, tenant_paused, cancel_by, cancel_reason, status, hold, reply, hold_id,
   gap_ms, supersede_by, followups, watched}
      hold   "admitted" | "rejected" | "conflict" | "unfit" | "none" (no hold stored) |
             "skipped" (paused or cancelled: nothing reserved)
      reply  ledger_reserve's reply when it was called, else the unfit dimension or ""
      hold_id  the reservation id when ledger_reserve was called, else ""
      gap_ms   milliseconds since the run last changed (its commit, for a continuing run)
      supersede_by  the run of its conversation that interrupts it (nothing is reserved), or ""
      followups     JSON list of the messages merged into it that no turn has seen, or ""
      watched       "1" when someone reads the run's live output now (KEYS 11 exists), else ""
]]
return run_load_at(
  {KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10],
   KEYS[11]},
  {ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]})
