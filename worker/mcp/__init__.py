"""MCP, both ways: the tools of a job's MCP servers, called from a worker's turns under the
run's deadline, approvals and idempotency keys (`toolbox.py`, over `_session.py`, `_stdio.py`
and `_loop.py`); and Turnstile itself as an MCP server (`server.py`, `turnstile mcp`).

What a job declares and the rules that map a server's tools and answers to the kernel's are
pure, in `turnstile.jobs.mcp`. Importing this package loads nothing of the `mcp` SDK: the
toolbox loads it when it first connects."""
