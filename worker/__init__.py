"""Turnstile's worker: the Celery app, the step task, the run store, controls and the CLI."""
