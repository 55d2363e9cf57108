"""Connecting to the state Redis, and refusing one that could lose leases."""

from __future__ import annotations

from pathlib import Path

import redis

from piloop_common.config import Settings
from piloop_common.errors import ConfigError, Unavailable
from piloop_server import embedded


def state_url(settings: Settings, home: Path) -> str:
    st = settings.plugins.state
    return st.url.get_secret_value() if st.url is not None else embedded.url(home)


def connect(settings: Settings, home: Path, *, start_embedded: bool = False) -> redis.Redis:
    if settings.plugins.state.embedded and start_embedded:
        embedded.start(home)
    url = state_url(settings, home)
    client = redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5, health_check_interval=30)
    try:
        client.ping()
    except redis.exceptions.RedisError as e:
        where = "the embedded Redis (is `piloop serve` running?)" if settings.plugins.state.embedded else "[plugins.state] url"
        raise Unavailable(f"Redis cannot be reached at {where}: {e}") from e
    return client


def check_policy(client: redis.Redis) -> None:
    """A Redis that may evict keys could drop a lease: refuse anything but noeviction."""
    policy = client.info("memory").get("maxmemory_policy", "noeviction")
    if policy != "noeviction":
        raise ConfigError(
            f"Redis maxmemory-policy is {policy}: it may evict leases and jobs. "
            "Set `maxmemory-policy noeviction` (CONFIG SET maxmemory-policy noeviction, or in redis.conf)")
