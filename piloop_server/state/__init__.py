"""Redis state: keys, Lua scripts, and typed wrappers around them."""
