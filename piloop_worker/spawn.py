"""A job's process, started without an exec of `setpriv`: in its own process group (or session), with a parent-death
signal armed, in its cgroup, as its user, its fds, cwd and environment exactly as given.

    pid = spawn(["make", "test"], env={"PATH": "/usr/bin:/bin"}, cwd=work, stdin=devnull, stdout=log, stderr=log,
                cgroup_procs=procs_fd, user=job_user)

Before its exec the child, in this order:

1. sets every signal's handler to SIG_DFL (ignored ones too: a job does not inherit its supervisor's SIG_IGN of
   SIGINT, SIGHUP or SIGPIPE) and, just before the exec, its signal mask to empty;
2. leads a process group of its own (`setpgid(0, 0)`), or a session with `new_session=True`;
3. joins the cgroup whose `cgroup.procs` the caller opened (`cgroup_procs`, an fd: the child writes "0" to it), so
   nothing of the job runs outside it and the supervisor never moves itself; changes to `cwd`, still as the
   caller, so a job's user needs no way through the dirs above it;
4. drops to `user`: `setgroups(user.groups)`, `setresgid(gid ×3)`, `setresuid(uid ×3)`; then, as the shim's job did,
   sets no_new_privs and enters a Landlock domain of its own (`jobuser.isolate`: a job cannot read a neighbour's
   `/proc/<pid>/environ`; skipped where the kernel has no Landlock);
5. arms the parent-death signal (`pdeathsig`, SIGKILL unless given; after the user's ids, whose change clears it) and
   then checks its parent is still the caller: one that died before the signal was armed sends none, so the child
   exits at once (the race prctl(2) describes);
6. puts `stdin`, `stdout` and `stderr` on 0, 1 and 2 (None leaves the caller's), keeps `pass_fds` open and closes
   every other fd;
7. execs `argv[0]`, searched on the PATH of `env` (not the caller's) as execvp does, with `env`
   as its whole environment.

A step that fails raises `SpawnError` here, in the caller: an OSError whose `errno` is the step's and whose message
names the command and the step (`cannot start 'nope': exec: No such file or directory`), with the child reaped;
never a child that exits 127 in silence. The pid returned is the caller's to wait for (`os.waitpid`, a pidfd).

The parent-death signal comes when the *thread* that spawned the child ends, not the process: spawn from a thread
that lives as long as the job (a slot supervisor's main thread).

Two implementations, one behaviour (tests/integration/test_spawn.py runs each test on both):

- `piloop_worker._spawn` (`_spawn.c`), built at install when a C compiler and Python's headers are there
  (pyproject's `ext-modules`, optional): clone(CLONE_VM | CLONE_VFORK) as glibc's posix_spawn, the steps above as
  system calls in the child, the failed step and its errno handed back in shared memory. 0.69 ms of CPU a
  `/bin/true` against 1.44 for `Popen` of `setpriv --pdeathsig KILL` (docs/performance.md, `python -m bench.spawn`).
- Without it, `subprocess.Popen` with a `preexec_fn` doing steps 1 and 3-5 (so a fork of the whole caller, several
  times the cost: 3.6 ms from a small process), a pipe of its own telling the caller which step failed.
  `PILOOP_SPAWN=python` forces it.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from piloop_common.prctl import PR_SET_PDEATHSIG, prctl
from piloop_worker import jobuser
from piloop_worker.jobuser import JobUser

try:
    from piloop_worker import _spawn as _c
except ImportError:  # installed without a C compiler: the subprocess fallback
    _c = None  # type: ignore[assignment]

ENV = "PILOOP_SPAWN"  # "python": the fallback even where the extension is built (the tests run both)
# the steps of the child, as `_spawn.c` numbers them (its `enum step`)
STEPS = (
    "",
    "setsid",
    "setpgid",
    "join its cgroup",
    "setgroups",
    "setresgid",
    "setresuid",
    "no_new_privs",
    "arm its parent-death signal",
    "its parent ended before the signal was armed",
    "set up its fds",
    "chdir",
    "exec",
)
_CGROUP, _SETGROUPS, _SETGID, _SETUID, _PDEATHSIG = 3, 4, 5, 6, 8
_DEFAULTED = tuple(s for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP))

_Path = str | os.PathLike[str]


class SpawnError(OSError):
    """A job's process that could not start: `errno` the failed step's, `step` its name, `command` argv[0]."""

    def __init__(self, command: str, step: str, err: int, path: str | None = None) -> None:
        super().__init__(err, os.strerror(err), path)
        self.command = command
        self.step = step

    def __str__(self) -> str:
        where = f" {self.filename!r}" if self.filename is not None and self.step == "chdir" else ""
        code = errno.errorcode.get(self.errno or 0, str(self.errno))
        return f"cannot start {self.command!r}: {self.step}{where}: {self.strerror} ({code})"


class Spawner(Protocol):
    def __call__(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: _Path | None = None,
        stdin: int | None = None,
        stdout: int | None = None,
        stderr: int | None = None,
        pdeathsig: int | None = signal.SIGKILL,
        new_session: bool = False,
        cgroup_procs: int | None = None,
        user: JobUser | None = None,
        pass_fds: Sequence[int] = (),
    ) -> int: ...


def spawn_c(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: _Path | None = None,
    stdin: int | None = None,
    stdout: int | None = None,
    stderr: int | None = None,
    pdeathsig: int | None = signal.SIGKILL,
    new_session: bool = False,
    cgroup_procs: int | None = None,
    user: JobUser | None = None,
    pass_fds: Sequence[int] = (),
) -> int:
    """`spawn` by the C extension; ImportError where it was not built."""
    if _c is None:
        raise ImportError("piloop_worker._spawn was not built (no C compiler or Python headers at install)")
    if not argv:
        raise ValueError("argv must not be empty")
    envp = [_env_item(k, v) for k, v in env.items()]
    pid, step, err = _c.spawn(
        _programs(argv[0], env),
        argv,
        envp,
        cwd,
        -1 if stdin is None else stdin,
        -1 if stdout is None else stdout,
        -1 if stderr is None else stderr,
        sorted({fd for fd in pass_fds if fd > 2}),
        new_session,
        -1 if cgroup_procs is None else cgroup_procs,
        -1 if user is None else user.uid,
        -1 if user is None else user.gid,
        None if user is None else user.groups,
        user is not None,
        int(pdeathsig or 0),
    )
    if pid == 0:
        raise SpawnError(argv[0], STEPS[step], err, os.fspath(cwd) if cwd is not None else None)
    return pid


def spawn_python(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: _Path | None = None,
    stdin: int | None = None,
    stdout: int | None = None,
    stderr: int | None = None,
    pdeathsig: int | None = signal.SIGKILL,
    new_session: bool = False,
    cgroup_procs: int | None = None,
    user: JobUser | None = None,
    pass_fds: Sequence[int] = (),
) -> int:
    """`spawn` by `subprocess.Popen` and a `preexec_fn` (a fork of the whole caller): the fallback."""
    if not argv:
        raise ValueError("argv must not be empty")
    for k, v in env.items():
        _env_item(k, v)
    told_r, told_w = os.pipe2(os.O_CLOEXEC)  # the failed step's number and errno, from the child
    prepare = _prepare(told_w, cgroup_procs, user, int(pdeathsig or 0), os.getpid())
    try:
        proc = subprocess.Popen(
            list(argv),
            env=dict(env),
            cwd=cwd,
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            pass_fds=tuple(pass_fds),
            process_group=None if new_session else 0,
            start_new_session=new_session,
            preexec_fn=prepare,
        )
    except subprocess.SubprocessError:  # the preexec_fn raised: its step is in the pipe
        os.close(told_w)
        told_w = -1
        step, _, err = os.read(told_r, 64).decode().partition(" ")
        if not err:  # raised by something other than a system call: a bug of this module's, not of the job
            raise
        raise SpawnError(argv[0], STEPS[int(step)], int(err)) from None
    except OSError as e:
        path = os.fspath(cwd) if cwd is not None else None
        if e.filename is None:  # before the chdir: its group or session, or its fds
            where = "setsid" if new_session else "setpgid"
        elif path is not None and os.fspath(e.filename) == path != argv[0]:
            where = "chdir"
        else:
            where = "exec"
        raise SpawnError(argv[0], where, e.errno or errno.EIO, path) from None
    finally:
        os.close(told_r)
        if told_w >= 0:
            os.close(told_w)
    # the caller waits for the pid: a Popen dropped unreaped would be reaped by subprocess at its next start
    proc.returncode = 0
    return proc.pid


def _prepare(told: int, cgroup_procs: int | None, user: JobUser | None, sig: int, parent: int) -> Callable[[], None]:
    """The fallback's steps in the forked child, between Popen's process group and its exec."""

    def prepare() -> None:
        step = 0
        try:
            for s in _DEFAULTED:
                try:
                    signal.signal(s, signal.SIG_DFL)
                except (OSError, ValueError):  # the libc's own real-time signals
                    pass
            signal.pthread_sigmask(signal.SIG_SETMASK, ())
            if cgroup_procs is not None:
                step = _CGROUP
                os.write(cgroup_procs, b"0")
            if user is not None:
                step = _SETGROUPS
                os.setgroups(list(user.groups))
                step = _SETGID
                os.setresgid(user.gid, user.gid, user.gid)
                step = _SETUID
                os.setresuid(user.uid, user.uid, user.uid)
                jobuser.isolate()
            if sig:
                step = _PDEATHSIG
                if not prctl(PR_SET_PDEATHSIG, sig):
                    raise OSError(errno.EINVAL, "prctl")
                if os.getppid() != parent:
                    os._exit(127)
        except OSError as e:
            os.write(told, f"{step} {e.errno or errno.EIO}".encode())
            raise

    return prepare


def _programs(name: str, env: Mapping[str, str]) -> list[str]:
    """The paths execvp would try for `name`, on the PATH of `env`."""
    if "/" in name:
        return [name]
    return [os.path.join(d, name) for d in os.get_exec_path(env)]


def _env_item(k: str, v: str) -> str:
    if not k or "=" in k:
        raise ValueError(f"illegal environment variable name {k!r}")
    return f"{k}={v}"


IMPLEMENTATIONS: dict[str, Spawner] = {"python": spawn_python, **({"c": spawn_c} if _c is not None else {})}
IMPLEMENTATION = "python" if os.environ.get(ENV) == "python" or _c is None else "c"
spawn: Spawner = IMPLEMENTATIONS[IMPLEMENTATION]

__all__ = ["ENV", "IMPLEMENTATION", "IMPLEMENTATIONS", "STEPS", "SpawnError", "spawn", "spawn_c", "spawn_python"]
