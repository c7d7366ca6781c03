"""The `turnstile` command: one module per command group."""
