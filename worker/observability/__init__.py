"""Metrics, tracing and logs."""
