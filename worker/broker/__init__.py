"""The broker: the step message, the Celery app's configuration (app.py) and the producer
that publishes through it, and everything that knows kombu's layout: what a worker's
connection does with an entry it cannot take in (transport.py on Redis, intake.py's consumer
on every broker) and the dead letters it keeps (deadletters.py)."""
