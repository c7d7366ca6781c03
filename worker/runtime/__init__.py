"""Inside a worker process: the Celery app, the step task, its services and hooks, the step,
the heartbeat and the pools. A step's limits, which a client computes too when it queues one,
are in worker/scheduling/limits.py."""
