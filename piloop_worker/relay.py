"""Each job's relay: a unix socket in its slot's dir (`PILOOP_RELAY`) where the job's own `piloop` calls arrive.

A slot's socket is bound once, at its first job, and switched to each job the slot runs (`add`); once a job ended
(`remove`) it answers every call `lease_lost` until the slot's next job. A call is forwarded under the lease it was
accepted under, never a later job's.

The worker forwards each call to the server under the job's id and lease token, with the worker's own
credentials; the server accepts it only while that lease is live (`/v1/relay/...`). The job never sees the
worker's token through the relay, and cannot name another job: the socket it connects to says which job it is.
Only the server's relay routes are forwarded (`relaypath.route`: the path decoded and normalised first, then matched
whole), with nothing of the job's call but its method, that canonical path and its body: the job, its lease, the
credential and the relay's marker (`RELAY_MARKER_HEADER`, which the server refuses on any other route) are the
worker's to add, so no header the job sends, a marker of its own included, reaches the server.

One thread runs one asyncio loop that serves every job's socket, reading each call (HTTP/1.0, one call a
connection) on the loop and forwarding it with the relay's blocking HTTP client on a small thread pool. So what the
worker spends on relays is bounded whatever its jobs do: a job that opens thousands of connections costs no
thread, a job holds at most `MAX_CALLS_PER_JOB` calls at once and half the pool, and one that connects and sends
nothing loses its slot after `READ_SECONDS`. A slow server never holds the worker's main loop or its heartbeat.

Jobs run as another user (`[plugins.executor] run_as`) cannot reach the slot's dir (root's, above their `work/`), so
each slot's socket is in a dir of its own (0700, the job user's) with a random name, inside one dir of the worker's
(0711: passed through, never listed), so a job finds its own socket by its `PILOOP_RELAY` and no neighbour's.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import http
import json
import logging
import os
import secrets
import socket
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from piloop_common.protocol.worker import RELAY_JOB_HEADER, RELAY_MARKER_HEADER, RELAY_TOKEN_HEADER
from piloop_common.sdk.client import ApiClient
from piloop_worker.jobuser import JobUser
from piloop_worker.lease import HeldLease
from piloop_worker.relaypath import SHOWN, NotARoute, route

log = logging.getLogger("piloop.worker")

SOCKET_NAME = "relay.sock"
BACKLOG = 16  # calls waiting to be accepted; a job's CLI makes one at a time
MAX_UNIX_PATH = 100  # AF_UNIX allows 108 bytes with the NUL; keep a margin
MAX_BODY = 1024 * 1024
MAX_HEADERS = 100  # as http.client allows
# The forwards are blocking calls to one server, each a few ms; a job's CLI makes one or two in a row, so a few
# threads serve every job of a worker, and a fixed number bounds the worker's threads whatever its jobs do.
CALL_THREADS = 8
# A job holds at most half the pool: a job whose calls the server is slow to answer leaves the rest to the others.
FORWARDS_PER_JOB = CALL_THREADS // 2
# A job's CLI makes its calls one after another; 16 at once is a job making calls from many processes, or a
# flood. A call over the cap is answered at once with a 503 naming the cap rather than refused unread: the job's
# `piloop` then says why, and the connection's fd is closed at once, so a flood cannot run the worker out of fds.
MAX_CALLS_PER_JOB = 16
READ_SECONDS = 10.0  # a call arrives whole at once from the job's CLI; one that does not frees its slot after this


def socket_path(job_root: Path) -> Path:
    """Where a job's relay listens: in its directory, or (a path too long for AF_UNIX) a private temp dir."""
    p = job_root / SOCKET_NAME
    if len(os.fsencode(p)) <= MAX_UNIX_PATH:
        return p
    try:
        return Path(tempfile.mkdtemp(prefix="piloop-relay-")) / SOCKET_NAME
    except OSError:
        return p  # binding it fails, and the job's log says its relay is not available


class _Listener:
    """One job's relay: its listener is the loop's, `calls` the loop's count, `removed` read by the pool too."""

    def __init__(self, lease: HeldLease, path: Path, sock: socket.socket) -> None:
        self.lease, self.path, self.sock = lease, path, sock
        self.calls = 0  # connections accepted and not yet answered
        self.forwards = asyncio.Semaphore(FORWARDS_PER_JOB)
        self.removed = False


class _Malformed(Exception):
    """A request the relay cannot read: answered 400 with this message."""


class Relay:
    """The relays of one worker's jobs. `add` when a job starts (or is re-attached), `remove` when it is reported.

    `add` binds and listens, and `remove` unlinks the socket file and marks the job removed, on the caller's thread;
    each hands the loop the rest (to accept, to close the listener) and returns without waiting for it: waiting
    cost the worker's loop a thread switch and a wait for the GIL back, 250-290 µs of its time for an add and a
    remove against 105-160 µs (2,000 of each in-process, a busy 2-core box). Once `remove` returns, no connection
    reaches the job, and a call of its already accepted is answered without being forwarded."""

    def __init__(self, api_factory: Callable[[], ApiClient], timeout: float, user: JobUser | None = None) -> None:
        self.api = api_factory()
        self.timeout = timeout
        self.user = user  # the user the jobs run as, who must reach and connect to their sockets
        self.base: Path | None = None  # with a user: the dir of the jobs' own socket dirs (0711)
        self.leases: dict[str, _Listener] = {}  # job -> its listener
        self.bound: dict[Path, _Listener] = {}  # socket path -> its listener, kept for the slot's next job
        self.own: dict[Path, Path] = {}  # with a user: a slot's dir -> its socket in a dir of its own
        self.lock = threading.Lock()
        self.closed = False
        self.pool = concurrent.futures.ThreadPoolExecutor(CALL_THREADS, thread_name_prefix="relay-call")
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name="relay", daemon=True)
        self.thread.start()

    # -- the worker's side -------------------------------------------------------------
    def path_for(self, run: Path) -> Path:
        """Where the relay of the job whose control files are in `run` listens (`socket_path`, or with a job user a
        socket dir of its own, made here)."""
        if self.user is None:
            return socket_path(run)
        if (known := self.own.get(run)) is not None and known.parent.is_dir():
            return known
        if self.base is None or not self.base.is_dir():
            self.base = Path(tempfile.mkdtemp(prefix="piloop-relays-"))
            os.chmod(self.base, 0o711)
        own = self.base / f"piloop-relay-{secrets.token_hex(16)}"
        own.mkdir(mode=0o700)
        os.chown(own, self.user.uid, self.user.gid)
        self.own[run] = own / SOCKET_NAME
        return own / SOCKET_NAME

    def add(self, lease: HeldLease, path: Path) -> None:
        """Listen for the job of `lease` at `path`: the listener bound there already, switched to it, else one bound
        now (a stale socket file there, from an earlier worker, is replaced)."""
        with self.lock:
            le = self.bound.get(path)
            if le is not None and not self.closed and le.sock.fileno() != -1 and os.path.exists(path):
                for job in [j for j, other in self.leases.items() if other is le]:
                    del self.leases[job]
                le.lease, le.removed = lease, False
                self.leases[lease.job] = le
                return
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
            s.listen(BACKLOG)  # a call made before the loop accepts waits in the backlog
            s.setblocking(False)
        except OSError:
            s.close()
            raise
        le = _Listener(lease, path, s)
        with self.lock:
            if self.closed:
                s.close()
                return
            old = self.leases.pop(lease.job, None)
            self.leases[lease.job] = le
            stale = self.bound.pop(path, None)
            self.bound[path] = le
            for gone in (old, stale):  # a re-attached job: its calls under way still go through
                if gone is not None and gone is not le:
                    self.loop.call_soon_threadsafe(self._stop, gone)
            self.loop.call_soon_threadsafe(self._listen, le)

    def add_or_say(self, lease: HeldLease, path: Path, output_log: Path) -> None:
        """`add`, or (the socket cannot be bound) let the job run, its own `piloop` calls failing, and say why in its
        log, `output_log`."""
        try:
            self.add(lease, path)
        except OSError as e:
            why = e.strerror or str(e)
            log.warning("event=relay.unavailable job=%s path=%s error=%s", lease.job, path, why)
            line = f"piloop: this job's relay is not available: {path}: {why}; piloop commands will fail\n"
            try:
                with open(output_log, "ab") as f:
                    f.write(line.encode(errors="replace"))
            except OSError as e2:
                log.warning("event=relay.unsaid job=%s error=%s", lease.job, e2)

    def remove(self, job: str) -> None:
        """The job ended: its slot's socket stays bound, and answers `lease_lost` until the slot's next job."""
        with self.lock:
            old = self.leases.pop(job, None)
            if old is not None:
                old.removed = True

    def close(self) -> None:
        """Stop listening (the socket files stay: a worker that re-attaches binds them again)."""
        with self.lock:
            if self.closed:
                return
            self.closed = True
            for le in {*self.leases.values(), *self.bound.values()}:
                le.removed = True
                self.loop.call_soon_threadsafe(self._stop, le)
            self.leases.clear()
            self.bound.clear()
            self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.api.close()

    # -- the loop ----------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self.loop.run_forever()
        finally:
            self.loop.run_until_complete(self._end())
            self.loop.close()

    async def _end(self) -> None:
        """The calls still being read or forwarded end unanswered, as the worker does."""
        left = asyncio.all_tasks() - {asyncio.current_task()}
        for task in left:
            task.cancel()
        await asyncio.gather(*left, return_exceptions=True)

    def _listen(self, le: _Listener) -> None:
        if le.sock.fileno() != -1:  # not closed meanwhile (out of fds, accepting paused for a second)
            self.loop.add_reader(le.sock.fileno(), self._accept, le)

    def _stop(self, le: _Listener) -> None:
        """The job's listener closed: its file is left in place."""
        if le.sock.fileno() != -1:
            self.loop.remove_reader(le.sock.fileno())
            le.sock.close()

    def _accept(self, le: _Listener) -> None:
        for _ in range(BACKLOG):
            try:
                conn, _ = le.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # out of fds, say: the calls wait in the backlog meanwhile, as asyncio's servers do
                log.warning("event=relay.accept_failed job=%s error=%s", le.lease.job, e)
                self.loop.remove_reader(le.sock.fileno())
                self.loop.call_later(1.0, self._listen, le)
                return
            if le.calls >= MAX_CALLS_PER_JOB:
                with contextlib.suppress(OSError):  # a few hundred bytes: a fresh socket's buffer takes them
                    conn.setblocking(False)
                    conn.send(_response(503, _busy()))
                conn.close()
                continue
            le.calls += 1
            self.loop.create_task(self._serve(le, conn))

    async def _serve(self, le: _Listener, conn: socket.socket) -> None:
        lease = le.lease  # the job it was accepted for: never forwarded under the slot's next one
        try:
            reader, writer = await asyncio.open_unix_connection(sock=conn)
            try:
                try:
                    async with asyncio.timeout(READ_SECONDS):
                        method, path, body = await _read_request(reader)
                except TimeoutError:
                    status, answer = 408, _error("timeout", f"the relay waited {READ_SECONDS:g} s for the whole call")
                except _Malformed as e:
                    status, answer = 400, _error("bad_request", f"the relay cannot read this call: {e}")
                else:
                    status, answer = await self._call(le, lease, method, path, body)
                writer.write(_response(status, answer))
                async with asyncio.timeout(READ_SECONDS):
                    await writer.drain()
            finally:
                writer.close()
        except ConnectionError:  # the job went before its answer
            return
        except Exception as e:  # noqa: BLE001 — one bad call never ends the relay
            log.warning("event=relay.error job=%s error=%s: %s", le.lease.job, type(e).__name__, e)
        finally:
            le.calls -= 1

    async def _call(
        self, le: _Listener, lease: HeldLease, method: str, path: str, body: bytes | None
    ) -> tuple[int, bytes]:
        if method not in ("GET", "POST"):
            return 501, _error("not_implemented", f"the relay forwards GET and POST calls, not {method}")
        if body is None:
            return 413, _error("too_large", f"a relayed call's body is at most {MAX_BODY} bytes")
        async with le.forwards:
            return await self.loop.run_in_executor(self.pool, self._forward_live, le, lease, method, path, body)

    # -- the pool's threads ------------------------------------------------------------
    def _forward_live(self, le: _Listener, lease: HeldLease, method: str, path: str, body: bytes) -> tuple[int, bytes]:
        if le.removed or le.lease is not lease:  # read after `remove` returned: the job has ended
            return 409, _error("lease_lost", f"job {lease.job} has ended: its relay forwards no more calls")
        return self.forward(le, method, path, body, lease)

    def forward(
        self, le: _Listener, method: str, path: str, body: bytes, lease: HeldLease | None = None
    ) -> tuple[int, bytes]:
        """Send one call to the server under the job's lease (`lease`, else the listener's); the server's status and
        body."""
        lease = lease or le.lease
        try:
            path = route(method, path)
        except NotARoute as e:
            log.warning("event=relay.refused job=%s path=%r why=%s", lease.job, path[:200], e)
            return 404, _error("not_found", f"the relay forwards only its own routes ({SHOWN}): {e}")
        headers = {RELAY_JOB_HEADER: lease.job, RELAY_TOKEN_HEADER: lease.token, RELAY_MARKER_HEADER: "1"}
        if body:
            headers["content-type"] = "application/json"
        try:
            status, content = self.api.request(method, path, body or None, headers=headers, timeout=self.timeout)
        except Exception as e:  # noqa: BLE001 — the server is away: the job's call fails now, as a direct call would
            return 503, _error("unavailable", f"the worker's relay cannot reach the server: {type(e).__name__}: {e}")
        log.info("event=relay.call job=%s path=%s status=%d", lease.job, path, status)
        return status, content


def _error(code: str, message: str) -> bytes:
    return json.dumps({"error": code, "message": message}).encode()


def _busy() -> bytes:
    return _error("busy", f"this job has {MAX_CALLS_PER_JOB} relay calls in flight, the most a job may have; try again")


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str, bytes | None]:
    """One HTTP/1.0 call: its method, its path without the query, and its body (None: over `MAX_BODY`, left
    unread)."""
    try:
        words = (await reader.readline()).decode("latin-1").split()
        if len(words) != 3 or not words[2].startswith("HTTP/"):
            raise _Malformed(f"a request line is METHOD PATH HTTP/1.x, not {' '.join(words)[:100]!r}")
        method, target, _ = words
        length = "0"
        for _ in range(MAX_HEADERS):
            line = await reader.readline()
            if line in (b"\r\n", b"\n"):
                break
            name, colon, value = line.decode("latin-1").partition(":")
            if not colon:
                raise _Malformed("the headers end early" if not line else f"a header without a colon: {name[:100]!r}")
            if name.strip().lower() == "content-length":
                length = value.strip()
        else:
            raise _Malformed(f"more than {MAX_HEADERS} headers")
        if not length.isdigit():
            raise _Malformed(f"content-length is a number of bytes, not {length[:100]!r}")
        n = int(length)
        if n > MAX_BODY:
            return method, target.split("?", 1)[0], None
        body = await reader.readexactly(n) if n else b""
    except asyncio.IncompleteReadError as e:
        raise _Malformed(f"the body ends after {len(e.partial)} of its {n} bytes") from e
    except ValueError as e:  # a line longer than the stream's limit (64 KiB)
        raise _Malformed(str(e)) from e
    return method, target.split("?", 1)[0], body


def _response(status: int, body: bytes) -> bytes:
    try:
        reason = http.HTTPStatus(status).phrase
    except ValueError:
        reason = ""
    head = f"HTTP/1.0 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    return head.encode("latin-1") + body
