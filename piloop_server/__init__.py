"""The piloop daemon: Redis state, the API, the pass."""
