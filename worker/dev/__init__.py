"""For development: the demo, the embedded server, the demo shop."""
