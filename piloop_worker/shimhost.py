"""The shim host: a single-threaded fork server the worker starts first, before it has any thread.

It reads one JSON request per line on stdin and hands each to a shim: an idle one when it has one, else a new
fork (≈1 ms, where a new interpreter costs 13–18 ms). Each shim `setsid()`s and outlives both the worker and the
host; the kernel reaps it. A shim runs one job at a time; when its job has ended (its exit record written, its
dir's lock let go) it says `idle` on its own socket pair with the host and waits there for the next request. A
job on a shim that ran one before costs ~1.5 ms of CPU where a fresh fork's costs ~6 ms: the fork, the copies of
the pages Python's reference counts write to, and the exit (docs/performance.md). The host lets an idle shim go
(closes its pair: the shim exits) after `IDLE_SECONDS`, when a task's module is imported here after the shim was
forked (the shim lacks it), and when the host exits, which is when its stdin closes: the worker died or
detached. A shim that is running a job then finishes it, and exits.

Each shim, once its exit record is written, sends the job dir's name as one datagram on a socket pair the worker
made (its fd in `PILOOP_SHIM_NOTIFY_FD`), so the worker's loop wakes the moment a job ends instead of on its next
tick. Only a wake-up: the exit record on disk is the truth, and the tick still finds it when a datagram is lost
(a full buffer, a worker that restarted and re-attached its jobs).

    python -m piloop_worker.shimhost
"""

from __future__ import annotations

import errno
import gc
import json
import os
import select
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

from piloop_common.prctl import set_name
from piloop_worker import cgroups, shim, tasks  # imported here, once, so every forked shim starts warm


IDLE_SECONDS = 60.0  # an idle shim held longer than this is let go: a burst's shims do not stay forever


class _Shim:
    """The host's end of one shim's socket pair, and what the host knows of that shim."""

    __slots__ = ("sock", "generation", "idle_since")

    def __init__(self, sock: socket.socket, generation: int) -> None:
        self.sock = sock
        self.generation = generation  # the host's imports when it was forked: a task's module imported later is not in it
        self.idle_since: float | None = None


class Host:
    def __init__(self, stdin_fd: int) -> None:
        self.shims: dict[int, _Shim] = {}  # by the host's fd
        self.generation = 0
        self.selector = selectors.DefaultSelector()  # epoll: more shims than select()'s 1,024 fds is allowed
        self.selector.register(stdin_fd, selectors.EVENT_READ)

    def handle(self, req: dict[str, Any]) -> None:
        if req.get("task") and tasks.preload(req["task"]):  # here, once: every later fork starts with it imported
            gc.freeze()
            self.generation += 1
            for fd in [fd for fd, sh in self.shims.items() if sh.idle_since is not None]:
                self.drop(fd)  # forked without the module: a task there would import it again in each process
        if req.get("cgroup"):
            cgroups.own_procs(req["cgroup"]["version"])  # read here once, not in every shim
        if self.hand_to_idle(req):
            return
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            pid = os.fork()
        except OSError:
            mine.close()
            theirs.close()
            return  # no shim: the worker finds no exit record and no lock, and reports the job lost
        if pid == 0:
            try:
                mine.close()
                self.selector.close()
                for sh in self.shims.values():  # the other shims' pairs: each must end when the host closes it
                    sh.sock.close()
                shim.main_forked(req, theirs)
            finally:
                os._exit(0)
        theirs.close()
        mine.setblocking(False)  # the host never waits on one shim
        self.shims[mine.fileno()] = _Shim(mine, self.generation)
        self.selector.register(mine, selectors.EVENT_READ)

    def hand_to_idle(self, req: dict[str, Any]) -> bool:
        """Send `req` to the idle shim idle the shortest (its pages the warmest); whether one took it."""
        idle = sorted(((sh.idle_since, fd) for fd, sh in self.shims.items() if sh.idle_since is not None), reverse=True)
        if not idle:
            return False
        data = json.dumps(req).encode()
        for _, fd in idle:
            sh = self.shims[fd]
            try:
                sh.sock.send(data)
            except OSError as e:
                if e.errno == errno.EMSGSIZE:
                    return False  # a request larger than a packet (a huge env): a fresh fork takes it
                self.drop(fd)  # the shim is gone
                continue
            sh.idle_since = None
            return True
        return False

    def heard(self, fd: int) -> None:
        """A shim said it is idle, or ended (its pair closed)."""
        sh = self.shims[fd]
        try:
            got = sh.sock.recv(64)
        except BlockingIOError:
            return  # an event for the fd's earlier holder, dropped in this round: nothing waits
        except OSError:
            got = b""
        if got == shim.IDLE and sh.generation == self.generation:
            sh.idle_since = time.monotonic()
        else:
            self.drop(fd)  # it ended, or it lacks a module imported since: it exits when its pair closes

    def drop(self, fd: int) -> None:
        sh = self.shims.pop(fd)
        self.selector.unregister(sh.sock)
        sh.sock.close()

    def retire(self, now: float) -> None:
        for fd, sh in list(self.shims.items()):
            if sh.idle_since is not None and now - sh.idle_since > IDLE_SECONDS:
                self.drop(fd)

    def close(self) -> None:
        for fd in list(self.shims):
            self.drop(fd)


def serve(stdin_fd: int) -> None:
    # the kernel reaps each shim the moment it ends (the shim sets SIGCHLD back for its own children): one fork a
    # job, where a double fork paid for a second copy of this process to be reaped by init instead
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    gc.freeze()  # what is imported now is never scanned by a shim's collector, so its pages stay shared
    host = Host(stdin_fd)
    pending = b""
    try:
        while True:
            for key, _ in host.selector.select(1.0):
                fd = key.fd
                if fd != stdin_fd:
                    if fd in host.shims:  # not dropped by an earlier event of this round
                        host.heard(fd)
                    continue
                chunk = os.read(stdin_fd, 1 << 16)
                if not chunk:
                    return  # the worker is gone or detached
                *lines, pending = (pending + chunk).split(b"\n")
                for raw in lines:
                    try:
                        req = json.loads(raw)
                    except ValueError:
                        continue
                    host.handle(req)
            host.retire(time.monotonic())
    finally:
        host.close()


def main() -> None:
    set_name("piloop-shimhost")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C to the worker's group is the worker's to handle
    shim.open_notify()
    shim.base_env()  # read here, once (after the notify fd's variable is gone): every shim forked later has it
    serve(sys.stdin.fileno())


class ShimHost:
    """The worker's handle on its shim host process."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.lock = threading.Lock()
        self.exits: socket.socket | None = None  # the worker's end of the wake-up pair

    def start(self) -> "ShimHost":
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            env = {**os.environ, shim.NOTIFY_ENV: str(theirs.fileno())}
            self.proc = subprocess.Popen([sys.executable, "-m", "piloop_worker.shimhost"], stdin=subprocess.PIPE,
                                         stdout=subprocess.DEVNULL, close_fds=True, pass_fds=(theirs.fileno(),),
                                         env=env)
        except BaseException:
            mine.close()
            raise
        finally:
            theirs.close()
        mine.setblocking(False)
        old, self.exits = self.exits, mine
        if old is not None:
            old.close()
        return self

    def wait_exit(self, timeout: float) -> bool:
        """Wait up to `timeout` for a shim to say its job ended; whether one did (every waiting word is read)."""
        sock = self.exits
        if sock is None:
            threading.Event().wait(timeout)
            return False
        try:
            ready, _, _ = select.select([sock], [], [], timeout)
        except (OSError, ValueError):  # closed meanwhile
            return False
        got = False
        while ready:
            try:
                sock.recv(512)
                got = True
            except (BlockingIOError, OSError):
                break
        return got

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def run_job(self, req: dict[str, Any]) -> None:
        """Ask for a shim for `req`: {dir, argv, env, timeout, kill_grace, cgroup, metrics_seconds, task}.

        With `task` (`module:function`), the host imports the module first, and the shim forks the task's
        process from itself (`piloop_worker.tasks`) instead of exec'ing `argv`.

        `env` is what the job adds to this process's environment, which the host inherited (`shim.job_env`); it
        carries the job's secret values: they cross this pipe and are never written to disk.
        """
        line = (json.dumps(req) + "\n").encode()
        with self.lock:
            for attempt in (0, 1):
                if not self.alive():
                    self.start()
                assert self.proc is not None and self.proc.stdin is not None
                try:
                    self.proc.stdin.write(line)
                    self.proc.stdin.flush()
                    return
                except (BrokenPipeError, OSError):
                    if attempt:
                        raise
                    self.close()

    def close(self) -> None:
        """Close the pipe: the host exits; the shims it forked keep running."""
        with self.lock:
            if self.proc is None:
                return
            try:
                if self.proc.stdin:
                    self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
            self.proc = None
            if self.exits is not None:
                self.exits.close()
                self.exits = None


if __name__ == "__main__":
    main()
