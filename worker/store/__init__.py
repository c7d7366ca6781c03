"""The Redis data model: runs, keys, Lua scripts (one loader), durability, memory."""
