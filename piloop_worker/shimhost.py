"""The shim host: a single-threaded fork server the worker starts first, before it has any thread.

It reads one JSON request per line on stdin and forks a shim for each (≈1 ms, where a new interpreter
costs 13–18 ms). Each shim `setsid()`s and outlives both the worker and the host; the kernel reaps it.
The host exits when its stdin closes, which is when the worker dies or detaches.

Each shim, once its exit record is written, sends the job dir's name as one datagram on a socket pair the worker
made (its fd in `PILOOP_SHIM_NOTIFY_FD`), so the worker's loop wakes the moment a job ends instead of on its next
tick. Only a wake-up: the exit record on disk is the truth, and the tick still finds it when a datagram is lost
(a full buffer, a worker that restarted and re-attached its jobs).

    python -m piloop_worker.shimhost
"""

from __future__ import annotations

import gc
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
from typing import Any

from piloop_common.prctl import set_name
from piloop_worker import cgroups, shim, tasks  # imported here, once, so every forked shim starts warm


def serve(stdin: Any) -> None:
    # the kernel reaps each shim the moment it ends (the shim sets SIGCHLD back for its own children): one fork a
    # job, where a double fork paid for a second copy of this process to be reaped by init instead
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    gc.freeze()  # what is imported now is never scanned by a shim's collector, so its pages stay shared
    for raw in stdin:
        try:
            req = json.loads(raw)
        except ValueError:
            continue
        if req.get("task") and tasks.preload(req["task"]):  # here, once: every later fork starts with it imported
            gc.freeze()
        if req.get("cgroup"):
            cgroups.own_procs(req["cgroup"]["version"])  # read here once, not in every shim
        try:
            pid = os.fork()
        except OSError:
            continue  # no shim: the worker finds no exit record and no lock, and reports the job lost
        if pid == 0:
            try:
                shim.main_forked(req)
            finally:
                os._exit(0)


def main() -> None:
    set_name("piloop-shimhost")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C to the worker's group is the worker's to handle
    shim.open_notify()
    serve(sys.stdin.buffer)


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

        `env` carries the job's secret values: they cross this pipe and are never written to disk.
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
