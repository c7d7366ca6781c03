"""Inside a worker process: the Celery app, the step task, its hooks and pools."""
