"""A task's process, fresh or warm: how a shim starts the process a Python task runs in (docs/worker.md, "Task
processes").

Fresh: a fork of the shim (itself a fork of the warm shim host) for each task, which exits with its task.
Warm (the worker's default): the process stays when its task ends, and the shim hands it its next task over a socket
pair: the module imported, nothing forked. Each task is still supervised as any job is: the shim's loop fences it by
the same deadline and, when it must stop (fenced, cancelled, timed out, lost), kills the process's whole group, so a
task that cannot renew dies before its lease ends; the next task then gets a fresh fork. A warm process retires
(SIGKILL, and a fresh fork for the next task) after `warm_max_tasks` tasks, once its resident memory passes
`warm_max_rss_mb` ([plugins.tasks]), when the next task's shipped code or PYTHONPATH is not the one it has imported, and with its shim
(its parent-death signal). Between tasks it waits in its shim's cgroup; during one it is in the task's, which
counts what it allocates then. Never for a job that runs as another user: that process is fresh.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import sys
from pathlib import Path

from piloop_common.files import write_file
from piloop_common.prctl import die_with_parent
from piloop_worker import tasks
from piloop_worker.cgroups import JobCgroup, own_procs
from piloop_worker.jobdir import JobDir
from piloop_worker.shimproto import ShimRequest

MAX_REQUEST = 1 << 20


def fork_fresh(req: ShimRequest, jd: JobDir, cg: JobCgroup | None) -> int:
    """A task's process of its own: forked from this shim, itself forked from the warm shim host."""
    _flush()  # nothing of the shim's own output is copied into the task's log
    pid = os.fork()
    if pid == 0:
        tasks.child(req, jd, cg.join_path() if cg is not None else None)  # never returns
    with contextlib.suppress(OSError):
        os.setpgid(pid, pid)  # as the child does: whichever runs first, the group exists before any signal
    return pid


class Warm:
    """This shim's warm task process (none until its first warm task)."""

    def __init__(self) -> None:
        self.pid = 0
        self.sock: socket.socket | None = None
        self.pidfd: int | None = None
        self.key: tuple[str | None, str] = (None, "")
        self.tasks = 0
        self._cpu_before = 0.0
        self.max_rss = 0  # bytes, the request's

    def start(self, req: ShimRequest, cg: JobCgroup | None) -> int:
        """Hand `req`'s task to the warm process (forked first when there is none that fits); its pid."""
        key = (req.code, req.env.get("PYTHONPATH", ""))
        self.max_rss = req.warm_max_rss_mb * 2**20
        if self.pid and not self.alive():
            self.gone()  # killed from outside between tasks (reaped now): nothing of it to signal
        if self.pid and (key != self.key or self.tasks >= req.warm_max_tasks):
            self.retire()
        for attempt in (0, 1):
            if not self.pid:
                self._fork(key)
            assert self.sock is not None
            try:
                if cg is not None:
                    write_file(cg.join_path(), str(self.pid))
                self._cpu_before = _cpu_seconds(self.pid)
                self.sock.sendall(req.wire())
            except OSError:
                # killed from outside since the look above (ESRCH joining the group, EPIPE sending): a fresh one
                self.retire()
                if attempt:
                    raise
                continue
            break
        return self.pid

    def alive(self) -> bool:
        """Whether the process is still there; one that is not (killed from outside between tasks: the OOM killer,
        an operator) is reaped here, so the next task gets a fresh one instead of a dead socket."""
        if not self.pid:
            return False
        if self.pidfd is not None and not select.select([self.pidfd], [], [], 0)[0]:
            return True  # the descriptor polls readable once it exited, whoever has its pid since
        try:
            done, _ = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            return False  # reaped already
        return not done

    def result(self) -> int | None:
        """The task's exit status, once its process has sent it (never waits); None until then, or when the
        process is gone (the shim's wait4 then has its status)."""
        if self.sock is None:
            return None
        try:
            raw = self.sock.recv(16, socket.MSG_DONTWAIT)
        except OSError:
            return None
        if not raw.strip().isdigit():
            return None
        self.tasks += 1
        return int(raw)

    def usage(self) -> tuple[float, int]:
        """The CPU seconds the task spent in the warm process, and the process's resident memory now."""
        return max(_cpu_seconds(self.pid) - self._cpu_before, 0.0), _rss_bytes(self.pid)

    def between_tasks(self, cg: JobCgroup | None) -> None:
        """After a task that ended by itself: the process back in the shim's cgroup (the task's is given back to the
        worker, or removed), or retired when it has grown past its request's most or cannot leave the task's group."""
        if cg is not None:
            own = own_procs(cg.version)
            try:
                if own is None:
                    raise OSError("the shim's own cgroup is not writable")
                write_file(own, str(self.pid))
            except OSError:
                self.retire()
                return
        if self.max_rss and _rss_bytes(self.pid) > self.max_rss:
            self.retire()

    def gone(self) -> None:
        """The process died (the shim reaped it): the next task gets a fresh one."""
        if self.sock is not None:
            self.sock.close()
        if self.pidfd is not None:
            os.close(self.pidfd)
        self.pid, self.sock, self.pidfd, self.tasks = 0, None, None, 0

    def retire(self) -> None:
        """SIGKILL to the process's group and the process reaped (if no one reaped it already); none is left."""
        if self.pid:
            # one that exited may be reaped already, and its pid another's: neither signalled nor waited for then
            exited = self.pidfd is not None and bool(select.select([self.pidfd], [], [], 0)[0])
            if not exited:
                with contextlib.suppress(OSError):
                    os.killpg(self.pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, os.WNOHANG if exited else 0)
        self.gone()

    def _fork(self, key: tuple[str | None, str]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        _flush()
        shim = os.getpid()
        pid = os.fork()
        if pid == 0:
            ours.close()
            _serve(theirs, shim)  # never returns
        theirs.close()
        with contextlib.suppress(OSError):
            os.setpgid(pid, pid)
        ours.set_inheritable(False)
        self.pid, self.sock, self.key, self.tasks = pid, ours, key, 0
        self.pidfd = pidfd_of(pid)


def pidfd_of(pid: int) -> int | None:
    """A descriptor that polls readable when `pid` exits (Linux 5.3+), or None to poll on a timer."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _serve(sock: socket.socket, shim: int) -> None:
    """The warm process: one task after another as its shim sends them, up to its `os._exit`."""
    # whatever ends it, its shim sees it end (wait4), and the next task gets a fresh process
    with contextlib.suppress(BaseException):
        _tasks(sock, shim)
    os._exit(0)


def _tasks(sock: socket.socket, shim: int) -> None:
    """Its setup once, then each task its shim sends, until the shim closes its end."""
    os.setpgid(0, 0)
    die_with_parent(shim, signal.SIGKILL)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    keep = sorted({sock.fileno(), devnull})
    os.closerange(3, keep[0])
    os.closerange(keep[0] + 1, keep[-1])
    os.closerange(keep[-1] + 1, os.sysconf("SC_OPEN_MAX"))
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    base = dict(os.environ)  # the shim host's, without the worker's credentials (`shim.base_env`)
    while raw := sock.recv(MAX_REQUEST):
        req = ShimRequest.parse(raw)
        jd = JobDir(Path(req.dir))
        code = tasks.CRASHED
        try:
            out = os.open(jd.output_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            os.dup2(out, 1)
            os.dup2(out, 2)
            os.close(out)
            os.chdir(jd.work)
            os.environ.clear()  # the last task's variables gone: only the host's and this task's
            os.environ.update({**base, **req.env})
            tasks.enter_task(req)
            assert req.task is not None
            code = tasks.run(req.task, jd, req)
        except Exception:  # noqa: BLE001 — the task's log says why; its status says it failed
            with contextlib.suppress(BaseException):
                import traceback

                traceback.print_exc()
        _flush()
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        os.chdir("/")
        sock.send(str(code).encode())


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


def _cpu_seconds(pid: int) -> float:
    """utime + stime of one process, from /proc (one read; psutil's walk of every process is for a job's tree)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rpartition(b")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def _rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, IndexError, ValueError):
        return 0


__all__ = ["Warm", "fork_fresh", "pidfd_of"]
