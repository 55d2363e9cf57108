"""Linux's prctl(2) for piloop's processes: a name for `ps -o comm`, `top` and `perf` (so a shim is not "python"),
the subreaper and parent-death settings, and what keeps a worker's secrets from its jobs (not dumpable, its
credentials out of its environment block)."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterable

PR_SET_PDEATHSIG, PR_SET_NAME, PR_SET_CHILD_SUBREAPER = 1, 15, 36
# the pid a child must die with, passed by its parent (`piloop serve` to its own worker): a child whose parent is
# already another process by the time it sets its parent-death signal was orphaned before it could
PARENT_ENV = "PILOOP_PARENT_PID"
# set by the local provisioner alone, which finds the workers it started by their /proc/<pid>/environ: such a worker
# stays dumpable (its jobs run as the server's user, who reads its files anyway); every other worker is not
LOCAL_PROVISIONED_ENV = "PILOOP_PROVISIONED_LOCAL"
_libc: ctypes.CDLL | None = None


def prctl(option: int, arg: int | bytes) -> bool:
    """Whether the kernel took it (False where there is no prctl, as off Linux)."""
    global _libc
    try:
        _libc = _libc or ctypes.CDLL(None, use_errno=True)  # kept: a forked shim calls it without loading libc again
        return bool(_libc.prctl(option, arg, 0, 0, 0) == 0)
    except (OSError, AttributeError):  # no libc, or a libc without prctl
        return False


def set_name(name: str) -> None:
    prctl(PR_SET_NAME, name.encode()[:15])


def set_parent_death_signal(sig: int) -> bool:
    """Have the kernel send `sig` when the thread that started this process ends, however it ends; whether it took.
    Check `os.getppid()` afterwards: a parent that died before this call sends nothing."""
    return prctl(PR_SET_PDEATHSIG, sig)


def die_with_parent(parent: int, sig: int) -> None:
    """Have the kernel send `sig` when `parent` (this process's parent now) ends, however it ends: SIGKILL, the OOM
    killer, a crash. A parent gone before this was armed sent nothing, so this process ends at once: exit 137."""
    set_parent_death_signal(sig)
    if os.getppid() != parent:
        os._exit(137)


PR_SET_DUMPABLE = 4


def set_dumpable(on: bool) -> bool:
    """Whether the kernel took it. Not dumpable: a process of the same user (a job) cannot read this one's
    `/proc/<pid>/environ` or `mem`, nor ptrace it; only CAP_SYS_PTRACE can. This process's own /proc stays readable
    to itself, and an exec in a child makes the child dumpable again."""
    return prctl(PR_SET_DUMPABLE, 1 if on else 0)


def forget_env(names: Iterable[str]) -> list[str]:
    """Remove each of `names` from this process's environment, the names removed: from `os.environ` (so no child
    inherits it), and first its value overwritten with NULs in the C environment block, whose bytes
    `/proc/<pid>/environ` shows whatever `unsetenv` did (where libc exposes `environ`; else os.environ only)."""
    gone = [n for n in names if n in os.environ]
    if not gone:
        return []
    wanted = {n.encode() for n in gone}
    try:
        env = ctypes.POINTER(ctypes.c_void_p).in_dll(ctypes.CDLL(None), "environ")
        i = 0
        while (addr := env[i]) is not None:
            name, eq, value = ctypes.string_at(addr).partition(b"=")
            if eq and name in wanted:
                ctypes.memset(addr + len(name) + 1, 0, len(value))
            i += 1
    except (OSError, AttributeError, ValueError):
        pass
    for n in gone:
        del os.environ[n]
    return gone
