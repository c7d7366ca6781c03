"""The agent kernel: pure, one turn at a time. No Redis, no Celery, no clock of its own."""
