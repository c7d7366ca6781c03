"""The support job: a store assistant that reads orders, issues refunds and sends emails."""
