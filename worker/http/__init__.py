"""The HTTP API: runs, live events over SSE, decisions, webhooks and per-tenant API keys, for
services that cannot import `worker.api.Client`. Built over that client and the operator library
(`worker.ops`); importing this package builds no app and connects to nothing."""
