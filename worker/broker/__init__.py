"""The broker: the step message and the producer that publishes it, and everything that knows
kombu's layout (the transport, dead letters)."""
