"""What a service imports: submit, state, decisions, memory. No Celery worker side."""
