"""The operator library shared by the CLI and HTTP, a module per concern: flags (pause, drain,
resume), queues (their views, drain --wait), decisions, listing (the one run listing), views
(one run, its events, its spans) and replay; subjects (what a control applies to) and errors
beneath them."""
