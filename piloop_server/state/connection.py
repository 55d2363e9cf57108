"""Connecting to the state Redis, and refusing one that could lose leases."""

from __future__ import annotations

from pathlib import Path

import redis

from piloop_common.config import Settings
from piloop_common.errors import ConfigError, Unavailable
from piloop_server.state import embedded

# what the rest of the server holds and hands on, never reads through: the state modules take it
Client = redis.Redis
# the errors that mean Redis is not answering (the API answers 503 for them)
UNREACHABLE: tuple[type[Exception], ...] = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)


def state_url(settings: Settings, home: Path) -> str:
    st = settings.plugins.state
    return st.url.get_secret_value() if st.url is not None else embedded.url(home)


def connect(settings: Settings, home: Path, *, start_embedded: bool = False) -> Client:
    if settings.plugins.state.embedded and start_embedded:
        embedded.start(home)
    url = state_url(settings, home)
    client = redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5, health_check_interval=30)
    try:
        client.ping()
    except redis.exceptions.RedisError as e:
        where = (
            "the embedded Redis (is `piloop serve` running?)"
            if settings.plugins.state.embedded
            else "[plugins.state] url"
        )
        raise Unavailable(f"Redis cannot be reached at {where}: {e}") from e
    return client


def check_policy(client: redis.Redis) -> None:
    """A Redis that may evict keys could drop a lease: refuse anything but noeviction."""
    policy = client.info("memory").get("maxmemory_policy", "noeviction")
    if policy != "noeviction":
        raise ConfigError(
            f"Redis maxmemory-policy is {policy}: it may evict leases and jobs. "
            "Set `maxmemory-policy noeviction` (CONFIG SET maxmemory-policy noeviction, or in redis.conf)"
        )
