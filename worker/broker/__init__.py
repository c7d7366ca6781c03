"""The broker: the step message and the producer that publishes it, and everything that knows
kombu's layout: what a worker's connection does with an entry it cannot take in (intake.py)
and the dead letters it keeps (deadletters.py)."""
