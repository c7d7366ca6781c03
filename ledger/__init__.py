"""The tenant ledger: atomic multi-dimension reservations in Redis, one Lua script per operation."""
