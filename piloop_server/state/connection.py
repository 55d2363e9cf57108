"""Connecting to the state Redis (a URL, or Sentinel's master for a service; TLS, an ACL user, a password file),
and refusing one that could lose leases."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from redis.connection import ConnectionPool, parse_url
from redis.retry import Retry
from redis.sentinel import MasterNotFoundError, Sentinel

from piloop_common.config.settings import Settings
from piloop_common.errors import ConfigError, Unavailable
from piloop_server.state import embedded, retry, target
from piloop_server.state.failover import Watch
from piloop_server.state.records.codec import text as _s

# the errors that mean Redis is not answering (the API answers 503 for them)
UNREACHABLE = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)
TIMEOUTS = {"socket_timeout": 10, "socket_connect_timeout": 5, "health_check_interval": 30}


# what the rest of the server holds and hands on, never reads through: the state modules take it
Client = redis.Redis


class StateClient(redis.Redis):
    """The server's client: plain commands retried (state.retry); `once`, on the same Redis, sends the calls that
    may go out only once; `repl_watch` follows the replication id (state.failover)."""

    once: redis.Redis | None = None
    repl_watch: Watch | None = None


def state_url(settings: Settings, home: Path) -> str:
    st = settings.plugins.state
    return st.url.get_secret_value() if st.url is not None else embedded.url(home)


def where(settings: Settings, home: Path) -> str:
    """The Redis the settings name, for a message (never its password)."""
    if settings.plugins.state.embedded:
        return "the embedded Redis (is `piloop serve` running?)"
    return f"[plugins.state] url ({target.read(settings.plugins.state, state_url(settings, home)).where()})"


def _build(t: target.Target, policy: Retry, watch: Watch | None, cls: type[redis.Redis], **opts: Any) -> Any:
    common: dict[str, Any] = {"retry": policy, **opts}
    if t.username is not None:
        common["username"] = t.username
    if t.password is not None:
        common["password"] = t.password
    if watch is not None:
        common["redis_connect_func"] = watch.connected
    if t.tls and t.ca_file:
        common["ssl_ca_certs"] = t.ca_file
    if t.sentinel:
        sentinel = Sentinel(list(t.sentinels), sentinel_kwargs=_sentinel_kwargs(t, opts))
        return sentinel.master_for(t.service, redis_class=cls, db=t.db, ssl=t.tls, **common)
    return cls.from_pool(ConnectionPool(**{**parse_url(t.url), **common}))


def _sentinel_kwargs(t: target.Target, opts: dict[str, Any]) -> dict[str, Any]:
    """How the Sentinels themselves are asked: the client's timeouts, TLS, and their own password."""
    seen: dict[str, Any] = {k: v for k, v in opts.items() if k.startswith("socket_")}
    if t.tls:
        seen.update(ssl=True, **({"ssl_ca_certs": t.ca_file} if t.ca_file else {}))
    if t.sentinel_password is not None:
        seen["password"] = t.sentinel_password
    return seen


def _sentinels_refusing(t: target.Target) -> list[str]:
    """The Sentinels that refuse this client's credentials (redis-py's master lookup reports each as not found)."""
    refusing = []
    for host, port in t.sentinels:
        try:
            with redis.Redis(host=host, port=port, **_sentinel_kwargs(t, TIMEOUTS)) as c:
                c.ping()
        except redis.exceptions.AuthenticationError:  # redis-py's for NOAUTH and WRONGPASS alike
            refusing.append(f"{host}:{port}")
        except redis.exceptions.RedisError:
            continue  # not answering: the lookup's own error says so
    return refusing


def open_client(settings: Settings, home: Path, **opts: Any) -> StateClient:
    """A client on the state Redis, not yet connected; `opts` are redis-py's (timeouts)."""
    t = target.read(settings.plugins.state, state_url(settings, home))
    watch = Watch(sentinel=t.sentinel)
    client: StateClient = _build(t, retry.idempotent(), watch, StateClient, **opts)
    client.once = _build(t, retry.once(), watch, redis.Redis, **opts)
    client.repl_watch = watch
    return client


def connect(settings: Settings, home: Path, *, start_embedded: bool = False) -> StateClient:
    if settings.plugins.state.embedded and start_embedded:
        embedded.start(home)
    client = open_client(settings, home, **TIMEOUTS)
    try:
        client.ping()
    except redis.exceptions.AuthenticationError as e:
        # redis-py's text names the user at most, never the password
        raise ConfigError(f"Redis refused the credentials at {where(settings, home)}: {e}") from None
    except MasterNotFoundError as e:
        t = target.read(settings.plugins.state, state_url(settings, home))
        if refusing := _sentinels_refusing(t):
            what = "a wrong password" if t.sentinel_password is not None else "no password"
            raise ConfigError(
                f"the Sentinels {', '.join(refusing)} refused {what}: set [plugins.state] sentinel_password_file to a "
                "file holding their requirepass"
            ) from None
        raise Unavailable(f"Redis cannot be reached at {where(settings, home)}: {e}") from None
    except redis.exceptions.RedisError as e:
        raise Unavailable(f"Redis cannot be reached at {where(settings, home)}: {e}") from None
    return client


@dataclass(frozen=True)
class PolicyCheck:
    policy: str  # "" when neither CONFIG nor INFO says it
    source: str  # "CONFIG", "INFO" or ""
    note: str  # what could not be checked ("" when all was)


def read_policy(client: redis.Redis) -> PolicyCheck:
    """`maxmemory-policy` from CONFIG GET, else (CONFIG renamed away or denied to the ACL user, as managed Redis
    does) from INFO memory, saying so."""
    try:
        got = client.config_get("maxmemory-policy")
        return PolicyCheck(_s(got.get("maxmemory-policy", "")), "CONFIG", "")
    except redis.exceptions.ResponseError as e:
        refused = str(e).split(".")[0][:120]
    try:
        policy = _s(client.info("memory").get("maxmemory_policy", ""))
    except redis.exceptions.ResponseError:
        policy = ""
    if policy:
        return PolicyCheck(policy, "INFO", f"CONFIG is refused ({refused}): maxmemory-policy read from INFO memory")
    return PolicyCheck(
        "", "", f"CONFIG is refused ({refused}) and INFO memory does not say: maxmemory-policy is not checked"
    )


def check_policy(client: redis.Redis) -> PolicyCheck:
    """A Redis that may evict keys could drop a lease: refuse anything but noeviction."""
    check = read_policy(client)
    if check.policy and check.policy != "noeviction":
        raise ConfigError(
            f"Redis maxmemory-policy is {check.policy}: it may evict leases and jobs. "
            "Set `maxmemory-policy noeviction` (CONFIG SET maxmemory-policy noeviction, or in redis.conf)"
        )
    return check
