"""The shim host: a single-threaded fork server the worker starts first, before it has any thread.

It reads one JSON request per line on stdin, takes the descriptor that comes with it (the shim's end of a socket
pair the worker made, on a second socket), and forks a shim for it (≈1 ms, where a new interpreter costs 13–18 ms).
Each shim `setsid()`s and outlives both the worker and the host; the kernel reaps it. The host does nothing else:
it is asked only when the worker has no idle shim to give a job to, and exits when its stdin closes (the worker died
or detached).

A shim runs one job at a time; when its job has ended (its exit record written) it waits on its pair for the next
request, which the worker sends it straight (`ShimHost.run_job`): a job on a shim that ran one before costs ~1.5 ms
of CPU where a fresh fork's costs ~6 ms (the fork, the copies of the pages Python's reference counts write to, and
the exit: docs/performance.md), and with no host between them a job costs the host nothing (its hop was ~0.2 ms of a
process job's ~5). The worker lets an idle shim go (closes its end: the shim exits) after `IDLE_SECONDS`, when a
task's module is sent to the host after the shim was forked (the shim lacks it), and when the worker exits; a shim
that is running a job then finishes it, and exits.

Each shim, once its exit record is written, sends the job dir's name as one datagram on a socket pair the worker
made (its fd in `PILOOP_SHIM_NOTIFY_FD`), so the worker's loop wakes the moment a job ends instead of on its next
tick, and knows the shim is idle. Only a wake-up: the exit record on disk is the truth, and the tick still finds it
when a datagram is lost (a full buffer, a worker that restarted and re-attached its jobs).

    python -m piloop_worker.shimhost
"""

from __future__ import annotations

import errno
import gc
import os
import select
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

from piloop_common.prctl import set_name
from piloop_worker import (
    cgroups,
    clock,
    gpus,
    jobuser,
    shim,
    spawning,
    tasks,
)  # imported here, once, so every forked shim starts warm
from piloop_worker.shimproto import ShimRequest

IDLE_SECONDS = 60.0  # an idle shim held longer than this is let go: a burst's shims do not stay forever
FDS_ENV = "PILOOP_SHIM_FDS_FD"  # the host's end of the socket the shims' pairs come on


def handle(req: ShimRequest, channel: int, keep: tuple[int, ...]) -> None:
    """Fork a shim for `req`, its end of the worker's pair `channel`; `keep` are the host's own fds (closed in it)."""
    # here, once: every later fork starts with it imported; never shipped code, whose modules are its own address's
    if req.task and not req.code and tasks.preload(req.task):
        gc.freeze()
    if req.cgroup is not None:
        cgroups.own_procs(req.cgroup.version)  # read here once, not in every shim
    try:
        pid = os.fork()
    except OSError:
        os.close(channel)  # no shim: the worker finds no exit record and no lock, and reports the job lost
        return
    if pid == 0:
        try:
            for fd in keep:
                os.close(fd)
            shim.main_forked(req, socket.socket(fileno=channel))
        finally:
            try:
                gpus.close()  # NVML, if a job's metrics opened it in this shim: os._exit runs no atexit
            finally:
                os._exit(0)  # never back into the host's loop, whatever failed
    os.close(channel)


def _take_fd(fds: socket.socket) -> int | None:
    """The descriptor the worker sent beside a request; None when the worker is gone."""
    try:
        _, got, _, _ = socket.recv_fds(fds, 16, 1, socket.MSG_CMSG_CLOEXEC)  # no job's exec gets it
    except OSError:
        return None
    return got[0] if got else None


def serve(stdin_fd: int, fds: socket.socket) -> None:
    # the kernel reaps each shim the moment it ends (the shim sets SIGCHLD back for its own children): one fork a
    # job, where a double fork paid for a second copy of this process to be reaped by init instead
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    gc.freeze()  # what is imported now is never scanned by a shim's collector, so its pages stay shared
    keep = (stdin_fd, fds.fileno())
    pending = b""
    while True:
        chunk = os.read(stdin_fd, 1 << 16)
        if not chunk:
            return  # the worker is gone or detached
        *lines, pending = (pending + chunk).split(b"\n")
        for raw in lines:
            channel = _take_fd(fds)  # every line comes with one, even one that does not parse
            if channel is None:
                return
            try:
                req = ShimRequest.parse(raw)
            except (ValueError, TypeError):
                os.close(channel)
                continue
            handle(req, channel, keep)


def main() -> None:
    set_name("piloop-shimhost")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C to the worker's group is the worker's to handle
    shim.open_notify()
    fds = socket.socket(fileno=int(os.environ.pop(FDS_ENV)))
    shim.base_env()  # read here, once (after the fds' variables are gone): every shim forked later has it
    spawning.setpriv_path()  # found once, likewise
    tasks.use_path(os.environ.pop(tasks.PATH_ENV, ""))
    serve(sys.stdin.fileno(), fds)


class _Shim:
    """The worker's end of one shim's socket pair, and what the worker knows of that shim."""

    __slots__ = ("generation", "idle_since", "jobs", "sock")

    def __init__(self, sock: socket.socket, generation: int) -> None:
        self.sock = sock
        self.generation = generation  # the host's imports when it was forked: a task's module sent later is not in it
        self.jobs = 1  # as the shim counts them: it exits after `shim.JOBS_PER_SHIM`
        self.idle_since = 0.0


class ShimHost:
    """The worker's handle on its shim host process, and on the shims it forked: a job goes to an idle shim straight,
    and to the host, to be forked a shim, only when none is idle."""

    def __init__(
        self,
        user: jobuser.JobUser | None = None,
        tasks_path: list[str] | None = None,
        warm_tasks: tuple[int, int] | None = None,
    ) -> None:
        self.user = user  # the user every job runs as (`[plugins.executor] run_as`), or None: the worker's
        # Python tasks in warm processes (`warm.py`): their most tasks and resident MiB; None: a fresh fork each
        self.warm_tasks = warm_tasks
        self.tasks_path = [os.path.abspath(p) for p in tasks_path or []]  # first on the host's sys.path
        if user is not None and not jobuser.available():
            import logging  # the worker's side only: the host process never imports it

            logging.getLogger("piloop.worker").warning(
                "event=worker.no_landlock run_as=%s: this kernel has no Landlock, so jobs run as one user can read "
                "each other's /proc/<pid>/environ (their secrets); run such jobs on separate workers",
                user.name,
            )
        self.proc: subprocess.Popen[bytes] | None = None
        self.lock = threading.Lock()
        self.exits: socket.socket | None = None  # the worker's end of the wake-up pair
        self.fds: socket.socket | None = None  # the worker's end of the socket the shims' pairs go to the host on
        self.idle: list[_Shim] = []  # the one idle the shortest last: its pages are the warmest
        self.busy: dict[str, _Shim] = {}  # by the name of the job dir it runs
        self.generation = 0
        self.sent_modules: set[str] = set()  # the task modules the host was sent (and so imports)

    def start(self) -> ShimHost:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        fds_mine, fds_theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            # never the worker's credentials: the host, its shims and their jobs have no use for them
            env = {
                **jobuser.without_credentials(os.environ),
                shim.NOTIFY_ENV: str(theirs.fileno()),
                FDS_ENV: str(fds_theirs.fileno()),
                tasks.PATH_ENV: os.pathsep.join(self.tasks_path),
            }
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "piloop_worker.shimhost"],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                close_fds=True,
                pass_fds=(theirs.fileno(), fds_theirs.fileno()),
                env=env,
            )
        except BaseException:
            mine.close()
            fds_mine.close()
            raise
        finally:
            theirs.close()
            fds_theirs.close()
        mine.setblocking(False)
        old, self.exits = self.exits, mine
        if old is not None:
            old.close()
        self.fds = fds_mine
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
        if not ready:
            return False
        with self.lock:
            return self._heard()

    def _heard(self) -> bool:
        """Read every word the shims sent; each names a job dir whose shim is now idle. Whether there was one."""
        got = False
        while self.exits is not None:
            try:
                word = self.exits.recv(512)
            except (BlockingIOError, OSError):
                break
            got = True
            name, _, flag = word.decode(errors="replace").partition("\0")
            self._ended(name, last=flag == "last")
        return got

    def ended(self, name: str, last: bool) -> None:
        """The job in dir `name` has its exit record (read by the worker): its shim is idle now, or, `last`, ends.
        The word the shim sends says so first; this is for a word that was lost."""
        with self.lock:
            self._ended(name, last)

    def _ended(self, name: str, last: bool) -> None:
        sh = self.busy.pop(name, None)
        if sh is None:
            return
        if last or sh.generation != self.generation or sh.jobs >= shim.JOBS_PER_SHIM:
            sh.sock.close()  # it ends on its own, or lacks a module sent since: it exits when its pair closes
            return
        sh.idle_since = clock.now()
        self.idle.append(sh)

    def _retire(self, now: float) -> None:
        while self.idle and now - self.idle[0].idle_since > IDLE_SECONDS:
            self.idle.pop(0).sock.close()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def run_job(self, req: ShimRequest) -> None:
        """Start a shim on `req`. With a `task`, the host imports its module first (every later fork has it)."""
        name = Path(req.dir).name
        if self.user is not None:
            req = req._replace(user=self.user.wire())
        with self.lock:
            self._heard()  # words not yet read: a worker's loop reads them first, a caller of its own may not
            module = tasks.module_of(req.task) if req.task and not req.code else ""
            if module and module not in self.sent_modules:
                self.sent_modules.add(module)  # the host imports it before the fork: shims forked before lack it
                self.generation += 1
                for sh in self.idle:
                    sh.sock.close()
                self.idle.clear()
            self._retire(clock.now())
            if not self._to_idle(name, req):
                self._fork(name, req)

    def _to_idle(self, name: str, req: ShimRequest) -> bool:
        """Send `req` to the idle shim idle the shortest; whether one took it."""
        if not self.idle:
            return False
        data = req.wire()
        while self.idle:
            sh = self.idle.pop()
            try:
                sh.sock.send(data)
            except OSError as e:
                if e.errno == errno.EMSGSIZE:
                    self.idle.append(sh)
                    return False  # a request larger than a packet (a huge env): a fresh fork takes it
                sh.sock.close()  # the shim is gone
                continue
            sh.jobs += 1
            self.busy[name] = sh
            return True
        return False

    def _fork(self, name: str, req: ShimRequest) -> None:
        """Have the host fork a shim for `req`, with the shim's end of a new pair."""
        line = req.wire() + b"\n"
        for attempt in (0, 1):
            if not self.alive():
                self.start()
            assert self.proc is not None and self.proc.stdin is not None and self.fds is not None
            mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                self.proc.stdin.write(line)
                self.proc.stdin.flush()
                socket.send_fds(self.fds, [b"p"], [theirs.fileno()])
            except (BrokenPipeError, OSError):
                mine.close()
                if attempt:
                    raise
                self._stop_host()
                continue
            finally:
                theirs.close()
            mine.setblocking(False)  # the worker never waits on one shim
            self.busy[name] = _Shim(mine, self.generation)
            return

    def _stop_host(self) -> None:
        """Close the host's pipe: the host exits; the shims keep running, and the worker keeps their pairs."""
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
        if self.fds is not None:
            self.fds.close()
            self.fds = None

    def close(self) -> None:
        """The host exits, and every shim's pair closes: an idle shim exits now, one running a job once it ends."""
        with self.lock:
            self._stop_host()
            for sh in [*self.idle, *self.busy.values()]:
                sh.sock.close()
            self.idle.clear()
            self.busy.clear()
            if self.exits is not None:
                self.exits.close()
                self.exits = None


if __name__ == "__main__":
    main()
