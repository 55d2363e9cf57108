"""What callers outside `state` catch when Redis cannot be reached, without importing redis themselves."""

from __future__ import annotations

import redis

# a connection refused, reset or timed out: retrying may help (scripts raise piloop_common.errors.Unavailable)
UNREACHABLE = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)
