"""Each job's relay: a unix socket in its directory (`PILOOP_RELAY`) where the job's own `piloop` calls arrive.

The worker forwards each call to the server under the job's id and lease token, with the worker's own
credentials; the server accepts it only while that lease is live (`/v1/relay/...`). The job never sees the
worker's token through the relay, and cannot name another job: the socket it connects to says which job it is.

One thread accepts on every job's socket (one epoll); each connection is served on a short-lived thread with
the relay's own HTTP client, so a slow server never holds the main loop or the heartbeat.
Only `/v1/relay/...` is forwarded, with nothing of the job's call but its method, path and body: the job, its lease
and the credential are the worker's to add.

Jobs run as another user (`[plugins.executor] run_as`) cannot reach the job's dir (root's, 0700, above their `work/`), so their sockets are each
in a dir of their own (0700, the job user's) with a random name, inside one dir of the worker's (0711: passed
through, never listed), so a job finds its own socket by its `PILOOP_RELAY` and no neighbour's.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import logging
import os
import secrets
import select
import socket
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from piloop_common.client import ApiClient
from piloop_common.protocol import RELAY_JOB_HEADER, RELAY_TOKEN_HEADER
from piloop_worker.jobuser import JobUser

log = logging.getLogger("piloop.worker")

SOCKET_NAME = "relay.sock"
MAX_UNIX_PATH = 100  # AF_UNIX allows 108 bytes with the NUL; keep a margin
MAX_BODY = 1024 * 1024
PREFIX = "/v1/relay/"


def socket_path(job_root: Path) -> Path:
    """Where a job's relay listens: in its directory, or (a path too long for AF_UNIX) a private temp dir."""
    p = job_root / SOCKET_NAME
    if len(os.fsencode(p)) <= MAX_UNIX_PATH:
        return p
    try:
        return Path(tempfile.mkdtemp(prefix="piloop-relay-")) / SOCKET_NAME
    except OSError:
        return p  # binding it fails, and the job's log says its relay is not available


class _Lease:
    def __init__(self, job: str, token: str, path: Path, sock: socket.socket) -> None:
        self.job, self.token, self.path, self.sock = job, token, path, sock


class Relay:
    """The relays of one worker's jobs. `add` when a job starts (or is re-attached), `remove` when it is reported.

    The worker's loop registers and drops each job's socket on the relay thread's epoll itself (epoll allows it while
    another thread waits on it), so a job's start and end do not wake that thread, and wait for the GIL back from it,
    as a queue of changes it applied had made them do. The thread may meet a socket dropped under it: its accept then
    fails, and it goes on."""

    def __init__(self, api_factory: Callable[[], ApiClient], timeout: float, user: JobUser | None = None) -> None:
        self.api = api_factory()
        self.timeout = timeout
        self.user = user  # the user the jobs run as, who must reach and connect to their sockets
        self.base: Path | None = None  # with a user: the dir of the jobs' own socket dirs (0711)
        self.ep = select.epoll()
        self.leases: dict[str, _Lease] = {}
        self.by_fd: dict[int, _Lease] = {}
        self.lock = threading.Lock()
        self.wake_r, self.wake_w = os.pipe()  # only to end the thread
        self.ep.register(self.wake_r, select.EPOLLIN)
        self.closed = False
        self.thread = threading.Thread(target=self._run, name="relay", daemon=True)
        self.thread.start()

    # -- the worker's side -------------------------------------------------------------
    def path_for(self, run: Path) -> Path:
        """Where the relay of the job whose control files are in `run` listens (`socket_path`, or with a job user a
        socket dir of its own, made here)."""
        if self.user is None:
            return socket_path(run)
        if self.base is None or not self.base.is_dir():
            self.base = Path(tempfile.mkdtemp(prefix="piloop-relays-"))
            os.chmod(self.base, 0o711)
        own = self.base / f"piloop-relay-{secrets.token_hex(16)}"
        own.mkdir(mode=0o700)
        os.chown(own, self.user.uid, self.user.gid)
        return own / SOCKET_NAME

    def add(self, job: str, token: str, path: Path) -> None:
        """Listen for `job` at `path` (a stale socket file there, from an earlier worker, is replaced)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            try:
                s.bind(str(path))
            except FileNotFoundError:  # a job re-attached after its socket's temp dir went: make it again
                path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                s.bind(str(path))
            os.chmod(path, 0o600)
            if self.user is not None:  # connecting takes write on the socket: the job's user only
                os.chown(path, self.user.uid, self.user.gid)
                if path.parent.name.startswith("piloop-relay-"):  # its own dir, made again for a re-attached job
                    os.chown(path.parent, self.user.uid, self.user.gid)
            s.listen(16)
            s.setblocking(False)
        except OSError:
            s.close()
            raise
        le = _Lease(job, token, path, s)
        with self.lock:
            if self.closed:
                s.close()
                return
            old = self.leases.pop(job, None)
            if old is not None:
                self._drop(old)
            self.leases[job] = le
            self.by_fd[s.fileno()] = le
            self.ep.register(s.fileno(), select.EPOLLIN)

    def remove(self, job: str) -> None:
        with self.lock:
            old = self.leases.pop(job, None)
            if old is None:
                return
            self._drop(old)
        with contextlib.suppress(OSError):
            os.unlink(old.path)
            if old.path.parent.name.startswith("piloop-relay-"):
                os.rmdir(old.path.parent)

    def close(self) -> None:
        """Stop listening (the socket files stay: a worker that re-attaches binds them again)."""
        with self.lock:
            if self.closed:
                return
            self.closed = True
            for le in self.leases.values():
                self._drop(le)
            self.leases.clear()
        with contextlib.suppress(OSError):
            os.write(self.wake_w, b"x")
        self.thread.join(5)
        self.api.close()

    def _drop(self, le: _Lease) -> None:
        """Under the lock: the socket out of the epoll, and closed."""
        fd = le.sock.fileno()
        if self.by_fd.get(fd) is le:
            del self.by_fd[fd]
            with contextlib.suppress(OSError):
                self.ep.unregister(fd)
        le.sock.close()

    # -- the relay's thread ------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                for fd, _ in self.ep.poll():
                    if fd == self.wake_r:
                        return
                    with self.lock:
                        le = self.by_fd.get(fd)
                    if le is None:
                        continue
                    try:
                        conn, _ = le.sock.accept()
                    except OSError:  # nothing to accept after all, or the job's socket dropped meanwhile
                        continue
                    conn.setblocking(True)
                    threading.Thread(target=self._serve, args=(conn, le), name=f"relay-{le.job}", daemon=True).start()
        finally:
            self.ep.close()
            for fd in (self.wake_r, self.wake_w):
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _serve(self, conn: socket.socket, le: _Lease) -> None:
        conn.settimeout(self.timeout * 3 + 5)
        try:
            _Handler(conn, ("relay", 0), (self, le))
        except Exception as e:  # noqa: BLE001 — one bad call never ends the relay
            log.warning("event=relay.error job=%s error=%s", le.job, e)
        finally:
            with contextlib.suppress(OSError):
                conn.close()

    def forward(self, le: _Lease, method: str, path: str, body: bytes) -> tuple[int, bytes]:
        """Send one call to the server under the job's lease; the server's status and body."""
        if not path.startswith(PREFIX):
            return 404, _error("not_found", f"the relay forwards only {PREFIX}… calls, not {path}")
        headers = {RELAY_JOB_HEADER: le.job, RELAY_TOKEN_HEADER: le.token}
        if body:
            headers["content-type"] = "application/json"
        try:
            status, content = self.api.request(
                method, path, body or None, headers={**self.api.headers, **headers}, timeout=self.timeout
            )
        except Exception as e:  # noqa: BLE001 — the server is away: the job's call fails now, as a direct call would
            return 503, _error("unavailable", f"the worker's relay cannot reach the server: {type(e).__name__}: {e}")
        log.info("event=relay.call job=%s path=%s status=%d", le.job, path, status)
        return status, content


def _error(code: str, message: str) -> bytes:
    return json.dumps({"error": code, "message": message}).encode()


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"  # one call per connection: the job's CLI makes one or two

    def _relay(self) -> None:
        relay, le = self.server  # type: ignore[misc]
        n = int(self.headers.get("content-length") or 0)
        if n > MAX_BODY:
            status, body = 413, _error("too_large", f"a relayed call's body is at most {MAX_BODY} bytes")
        else:
            status, body = relay.forward(le, self.command, self.path.split("?", 1)[0], self.rfile.read(n) if n else b"")
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _relay

    def log_message(self, format: str, *args: object) -> None:  # the relay logs its own events
        return
