"""The fields of a run's hash (`keys.run`), named once.

Every reader and writer in Python names a field by its constant here; the Lua scripts that
write the hash (`lua/run_*.lua`) spell the same names, and their headers say which they touch.
A new field gets a constant here, with a line saying who writes it.
"""

from __future__ import annotations

# Written by run_create.lua when the run is made.
STATE = "state"  # the run's RunState, JSON (schema-versioned); rewritten by every commit
VERSION = "version"  # bumped by every commit: the compare-and-set of every write
STATUS = "status"  # a jobs.outcomes.Status value
FINGERPRINT = "fingerprint"  # the submission's, so a retry is told apart from another run
QUEUE = "queue"
JOB = "job"
USER = "user"
CREATED_MS = "created_ms"  # the store's clock
UPDATED_MS = "updated_ms"  # set by every commit
PRIORITY = "priority"  # 0-9 (scheduling/priority.py)
CONVERSATION = "conversation"  # a run of a conversation only
HOLD = "hold"  # the next turn's ledger hold, JSON, taken by its load (run_load.lua)

# Written by run_commit.lua.
OUTCOME = "outcome"  # a jobs.outcomes.Outcome value once stopped, else ""
DETAIL = "detail"
REASON = "reason"  # the outcome in words, an excerpt

# Written by the load of a step (run_lib.lua) and by the holds it takes (run_hold.lua).
ATTEMPTS = "attempts"
ATTEMPT_VERSION = "attempt_version"
ATTEMPT_TOKENS = "attempt_tokens"
LOADED_MS = "loaded_ms"  # when a delivery last loaded the run (the sweeper compares)
HOLDS = "holds"  # the ledger holds open for this version, space-separated ids

# Written by a cancel request (run_mark.lua) and cleared by the commit that acts on it.
CANCEL_BY = "cancel_by"
CANCEL_REASON = "cancel_reason"
CANCEL = (CANCEL_BY, CANCEL_REASON)

# Conversations (run_create.lua, run_commit.lua).
SUPERSEDE_BY = "supersede_by"  # the run of the conversation that interrupts this one
FOLLOWUPS = "followups"  # JSON list of follow-ups no turn has seen yet

# Written by the sweeper: "<version>|<ms>" of the step it last sent again.
RESENT = "resent"
