"""Inside a worker process: the Celery app, the step task, its services and hooks, the step,
the heartbeat and the pools; and a step's limits (limits.py), which a client computes too when
it queues one."""
