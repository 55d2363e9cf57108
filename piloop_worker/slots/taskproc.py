"""A slot's task process: warm (kept, one task after another, its modules imported once) or a fresh fork per task.

The supervisor forks it and talks to it over a socket pair, one datagram each way a task:

    → {"request": SlotRequest.to_json(), "cwd": "...", "result_file": "..."}
    ← {"code": 0 | 1, "classes": [...], "reason": "...", "value": base64 | null, "value_file": "..." | null}

The arguments come inline in the request and the value goes back inline, up to `INLINE_MAX_BYTES`; a larger value is
written to `result_file` (the slot's `work/`) and named instead. No file is made per task otherwise. The process is
the supervisor's child with a parent-death signal, in a process group of its own; a warm one waits between tasks in
the supervisor's cgroup with its stdout and stderr on /dev/null, and for a task joins the task's cgroup with both on
the slot's `output.log`. It is retired (SIGKILL, and a fresh fork for the next task) past `warm_max_tasks` or
`warm_max_rss_mb`, when the next task ships other code or another PYTHONPATH, and before a job of another kind or
user runs on the slot (docs/worker.md, "Task processes").
"""

from __future__ import annotations

import base64
import contextlib
import gc
import json
import os
import pickle
import resource
import select
import signal
import socket
import sys
from pathlib import Path
from typing import Any, NamedTuple

from piloop_common.bytecaps import INLINE_MAX_BYTES
from piloop_common.exceptionnames import CLASSES_MOST, classes_of
from piloop_common.files import write_file
from piloop_common.prctl import die_with_parent, set_name
from piloop_worker import jobuser, tasks
from piloop_worker.cgroups import JobCgroup, own_procs
from piloop_worker.slots.wire import MAX_DATAGRAM, SlotRequest

FAILED = tasks.FAILED


class TaskOutcome(NamedTuple):
    """A task's end as its process tells it."""

    code: int
    classes: tuple[str, ...] = ()
    reason: str = ""
    value: bytes | None = None
    value_file: str | None = None
    cpu: float = 0.0  # the CPU seconds the process spent on the task
    rss: int = 0  # its resident bytes after the task
    children: bool = True  # whether it has a child left (False: the task left no process behind in it)
    error: bytes | None = None  # a failed task's record, JSON: its type, classes, message and traceback

    def wire(self) -> bytes:
        d = {
            **self._asdict(),
            "value": base64.b64encode(self.value).decode() if self.value is not None else None,
            "error": base64.b64encode(self.error).decode() if self.error is not None else None,
        }
        return json.dumps(d).encode()

    @classmethod
    def parse(cls, raw: bytes) -> TaskOutcome | None:
        try:
            d = json.loads(raw)
            value = d.get("value")
            classes = tuple(c for c in d.get("classes") or () if isinstance(c, str))[:CLASSES_MOST]
            return cls(
                int(d["code"]),
                classes,
                str(d.get("reason") or "")[: tasks.REASON_MAX],
                base64.b64decode(value) if value is not None else None,
                str(d["value_file"]) if d.get("value_file") else None,
                float(d.get("cpu") or 0.0),
                int(d.get("rss") or 0),
                bool(d.get("children", True)),
                base64.b64decode(d["error"]) if d.get("error") else None,
            )
        except (ValueError, TypeError, KeyError, AttributeError):
            return None


class TaskProcess:
    """The slot's task process, when it has one (`pid` 0 when not)."""

    def __init__(self, log_fd: int) -> None:
        self.log_fd = log_fd  # the slot's output.log, O_APPEND: the process keeps it from its fork
        self.pid = 0
        self.sock: socket.socket | None = None
        self.pidfd: int | None = None
        self.fresh = False
        self.key: tuple[str | None, str] = (None, "")
        self.tasks = 0

    def start(self, req: SlotRequest, cwd: str, result_file: str, cg: JobCgroup | None) -> int:
        """Hand `req`'s task to a process (warm when it may be, forked first when none fits); its pid."""
        user = jobuser.JobUser.of(req.user)
        fresh = not req.warm_max_tasks or user is not None
        key = (req.code, req.env.get("PYTHONPATH", ""))
        if self.pid and not self.alive():
            self.gone()  # killed from outside between tasks: reaped now, nothing of it to signal
        if self.pid and (fresh or key != self.key or self.tasks >= req.warm_max_tasks):
            self.retire()
        if fresh and req.task and not req.code and tasks.preload(req.task):
            gc.freeze()  # imported here once: each fresh fork starts with it
        message = json.dumps({"request": req.to_json(), "cwd": cwd, "result_file": result_file}).encode()
        for attempt in (0, 1):
            if not self.pid:
                self._fork(key, fresh, user, cg)
            assert self.sock is not None
            try:
                if cg is not None and not fresh:
                    write_file(cg.join_path(), str(self.pid))
                self.sock.sendall(message)
            except OSError:
                # killed from outside since the look above (ESRCH joining the group, EPIPE sending): a fresh one
                self.retire()
                if attempt:
                    raise
                continue
            break
        return self.pid

    def outcome(self) -> TaskOutcome | None:
        """The task's end, once its process has sent it (never waits)."""
        if self.sock is None:
            return None
        try:
            raw = self.sock.recv(MAX_DATAGRAM, socket.MSG_DONTWAIT)
        except OSError:
            return None
        got = TaskOutcome.parse(raw) if raw else None
        if got is not None:
            self.tasks += 1
        return got

    def between_tasks(self, cg: JobCgroup | None, max_rss_mb: int, rss: int) -> None:
        """After a task that ended by itself: back in the supervisor's cgroup, or retired when it cannot leave the
        task's or has grown past `max_rss_mb` (`rss`, its resident bytes as it said)."""
        if cg is not None:
            own = own_procs(cg.version)
            try:
                if own is None:
                    raise OSError("the supervisor's own cgroup is not writable")
                write_file(own, str(self.pid))
            except OSError:
                self.retire()
                return
        if max_rss_mb and rss > max_rss_mb * 2**20:
            self.retire()

    def alive(self) -> bool:
        if not self.pid:
            return False
        if self.pidfd is not None and not select.select([self.pidfd], [], [], 0)[0]:
            return True
        try:
            done, _ = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            return False
        return not done

    def gone(self) -> None:
        """The process died (and was reaped): the next task gets a fresh one."""
        if self.sock is not None:
            self.sock.close()
        if self.pidfd is not None:
            os.close(self.pidfd)
        self.pid, self.sock, self.pidfd, self.tasks = 0, None, None, 0

    def retire(self) -> None:
        """SIGKILL to the process's group, the process reaped; none is left."""
        if self.pid:
            exited = self.pidfd is not None and bool(select.select([self.pidfd], [], [], 0)[0])
            if not exited:
                with contextlib.suppress(OSError):
                    os.killpg(self.pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, os.WNOHANG if exited else 0)
        self.gone()

    def _fork(
        self, key: tuple[str | None, str], fresh: bool, user: jobuser.JobUser | None, cg: JobCgroup | None
    ) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        for s in (ours, theirs):
            with contextlib.suppress(OSError):
                s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, MAX_DATAGRAM)
        _flush()
        parent = os.getpid()
        join = cg.join_path() if cg is not None and fresh else None
        pid = os.fork()
        if pid == 0:
            ours.close()
            code = tasks.CRASHED
            with contextlib.suppress(BaseException):
                code = _serve(theirs, parent, self.log_fd, fresh, user, join)
            os._exit(code)
        theirs.close()
        with contextlib.suppress(OSError):
            os.setpgid(pid, pid)  # as the child does: whichever runs first, the group exists before any signal
        ours.set_inheritable(False)
        self.pid, self.sock, self.key, self.tasks, self.fresh = pid, ours, key, 0, fresh
        try:
            self.pidfd = os.pidfd_open(pid)
        except OSError:
            self.pidfd = None


def _serve(
    sock: socket.socket, parent: int, log_fd: int, one: bool, user: jobuser.JobUser | None, join: Path | None
) -> int:
    """The task process: its setup once, then each task the supervisor sends (one, for a fresh fork); its status."""
    set_name("piloop-task")  # in ps and top, and in bench.syscalls' split, apart from its supervisor
    os.setpgid(0, 0)
    if join is not None:
        write_file(join, str(os.getpid()))
    if user is not None:
        jobuser.become(user)
        jobuser.isolate()
    die_with_parent(parent, signal.SIGKILL)  # after its user is set, which clears a parent-death signal
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    keep = sorted({sock.fileno(), devnull, log_fd})
    low = 3
    for fd in keep:
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, os.sysconf("SC_OPEN_MAX"))
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_DFL)
    base = dict(os.environ)  # the supervisor's, without the worker's credentials
    code = tasks.CRASHED
    while raw := sock.recv(MAX_DATAGRAM):
        got = TaskOutcome(tasks.CRASHED)
        try:
            msg = json.loads(raw)
            req = SlotRequest.from_json(msg["request"])
            os.dup2(log_fd, 1)
            os.dup2(log_fd, 2)
            os.chdir(msg["cwd"])
            os.environ.clear()  # the last task's variables gone: only the supervisor's and this task's
            os.environ.update({**base, **req.env})
            _reopen_streams()
            tasks.enter_task(req)
            before = resource.getrusage(resource.RUSAGE_SELF)
            got = call(req, str(msg["result_file"]))
            after = resource.getrusage(resource.RUSAGE_SELF)
            cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
            got = got._replace(cpu=round(max(cpu, 0.0), 6), rss=rss_bytes(), children=_has_children())
        except Exception:  # noqa: BLE001 — the task's log says why; its status says it failed
            with contextlib.suppress(BaseException):
                import traceback

                traceback.print_exc()
        _flush()
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        os.chdir("/")
        code = got.code
        sock.send(got.wire())
        if one:
            break
    return code


def call(req: SlotRequest, result_file: str) -> TaskOutcome:
    """Call `req`'s task with its inline arguments: its value inline (or in `result_file` when over the cap), or the
    classes of what it raised, or the one line of a module that cannot be imported."""
    assert req.task is not None
    try:
        args, kwargs = arguments(req)
        try:
            fn = tasks.resolve(req.task)
        except ModuleNotFoundError as e:
            line = tasks.unimportable(req.task, e, req)
            if line is None:
                raise
            sys.stderr.write(line + "\n")
            return TaskOutcome(FAILED, tuple(classes_of(e)), line, error=_error(e, line, "", reason=line))
        value = fn(*args, **kwargs)
        data = tasks.dump_result(req.serializer, value)
    except BaseException as e:  # noqa: BLE001 — whatever the task raised (SystemExit too) is its failure
        import traceback

        tb = traceback.format_exc()
        sys.stderr.write(tb)
        return TaskOutcome(FAILED, tuple(classes_of(e)), error=_error(e, str(e), tb))
    if len(data) <= INLINE_MAX_BYTES:
        return TaskOutcome(0, value=data)
    with open(result_file, "wb") as f:
        f.write(data)
    return TaskOutcome(0, value_file=result_file)


def arguments(req: SlotRequest) -> tuple[list[Any], dict[str, Any]]:
    """The call's args and kwargs; a chain's link gets its parent's value first."""
    if req.serializer not in tasks.SERIALIZERS:
        raise ValueError(f"serializer {req.serializer!r}: use one of {', '.join(tasks.SERIALIZERS)}")
    args = req.args if req.args is not None or not req.args_file else _read(req.args_file)
    data = _load(req.serializer, args) if args is not None else {}
    piped: list[Any] = []
    raw_parent = req.parent if req.parent is not None or not req.parent_file else _read(req.parent_file)
    if raw_parent is not None:
        of_parent = req.parent_serializer or req.serializer
        parent = _load(of_parent, raw_parent)
        piped = [parent["value"] if of_parent == "json" else parent]
    return [*piped, *(data.get("args") or [])], dict(data.get("kwargs") or {})


def _error(e: BaseException, message: str, tb: str, **more: str) -> bytes:
    """A failed task's record, as its report's `error.json` carries it to `AsyncResult.traceback`."""
    record = {"type": type(e).__name__, "classes": classes_of(e), "message": message, "traceback": tb, **more}
    return json.dumps(record).encode()


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _load(serializer: str, raw: bytes) -> Any:
    return json.loads(raw) if serializer == "json" else pickle.loads(raw)


def _reopen_streams() -> None:
    """A stream an earlier task closed, open again on its fd (which the task's start has just set again)."""
    for name, fd in (("stdout", 1), ("stderr", 2)):
        stream = getattr(sys, name)
        if stream is None or stream.closed:
            setattr(sys, name, open(fd, "w", buffering=1, closefd=False, errors="backslashreplace"))


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


def _has_children() -> bool:
    """Whether this process has a child left (one that exited is reaped here)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0:
            return True


_PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    """This process's resident memory (three system calls: no Python file object)."""
    try:
        fd = os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)
        try:
            return int(os.read(fd, 256).split()[1]) * _PAGE
        finally:
            os.close(fd)
    except (OSError, IndexError, ValueError):
        return 0


__all__ = ["TaskOutcome", "TaskProcess", "arguments", "call", "rss_bytes"]
