"""What the API and the pass share: settings, the Redis client and the stores built on it."""

from __future__ import annotations

import asyncio
import getpass
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import redis
import redis.asyncio

from piloop_common.cas import Store
from piloop_common.config import ExecutorConfig, Settings
from piloop_server.events import Events
from piloop_server.limits import Limits
from piloop_server.secrets import Secrets
from piloop_server.state.keys import Keys
from piloop_server.state.leases import Leases, Timings
from piloop_server.state.scripts import AsyncScripts
from piloop_server.tokens import CACHE_SECONDS, TokenStore


@dataclass
class Runtime:
    settings: Settings
    home: Path
    redis: redis.Redis
    store: Store
    cas_id: str
    keys: Keys = field(init=False)
    leases: Leases = field(init=False)
    tokens: TokenStore = field(init=False)
    limits: Limits = field(init=False)
    events: Events = field(init=False)
    secrets: Secrets = field(init=False)
    user: str = field(default_factory=getpass.getuser)
    server_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    executor: ExecutorConfig = field(init=False)
    lock: threading.Lock = field(default_factory=threading.Lock)
    redis_url: str | None = None  # for `async_scripts`; without it the hot routes call Redis from a thread
    _async: tuple[asyncio.AbstractEventLoop, AsyncScripts] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.keys = Keys(self.settings.namespace)
        self.executor = self.settings.plugins.executor
        self.leases = Leases(self.redis, self.keys, Timings.from_executor(self.executor))
        self.tokens = TokenStore(self.redis, self.keys, cache_seconds=CACHE_SECONDS)
        self.limits = Limits(self.redis, self.keys)
        self.events = Events(self.redis, self.keys)
        self.secrets = Secrets(self.redis, self.keys, self.home)  # refuses a key file others can read
        self.refresh_limits()

    def async_scripts(self) -> AsyncScripts | None:
        """The scripts on an asyncio client of the running loop, made at its first use there (a client's
        connections belong to one loop); None without `redis_url`."""
        if self.redis_url is None:
            return None
        loop = asyncio.get_running_loop()
        if self._async is None or self._async[0] is not loop:
            client = redis.asyncio.Redis.from_url(self.redis_url, socket_timeout=10, socket_connect_timeout=5,
                                                  health_check_interval=30)
            self._async = (loop, AsyncScripts(client))
        return self._async[1]

    def refresh_limits(self) -> list[str]:
        """Apply the limits to config.toml's executor (each pass, and at once after a change)."""
        executor, bad = Limits.apply(self.settings.plugins.executor, self.limits.all())
        self.executor = executor
        return bad
