"""Jobs as another user (`[plugins.executor] run_as`), and what a job's environment never holds.

A worker that runs as root may run its jobs as an unprivileged user: the shim stays root (it fences, kills and
reaps), and the job's process drops to the user between the fork and the exec (`subprocess`'s `user`, `group` and
`extra_groups`, done in C; the one Python step there is `isolate`, two system calls). Its dirs (`work/`, `outputs/`,
`inputs/`) become the user's; everything else of the worker (its home, token file, spool, `<dir>/jobs/`
and so other jobs' dirs) stays root's.

The user alone does not keep one job out of another's `/proc/<pid>/environ`: two jobs as one user may read each
other's (the kernel's ptrace rule for one uid). So each job's process also enters a Landlock domain of its own
(`isolate`, Linux 5.13+): a process may then read `/proc/<pid>/environ`, `mem`, `fd/` only of processes in its own
domain or one nested in it, so a job reads its own children's, never a neighbour's, the shim's or the worker's. The
domain restricts nothing else (it handles one right, making block devices, which the user lacks anyway). Where
Landlock is missing the worker says so at start (`available`).
"""

from __future__ import annotations

import ctypes
import os
import pwd
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from piloop_common.errors import ConfigError
from piloop_common.prctl import prctl

# a worker's credentials, and any state credential: never in a job's environment (the shim host is started without
# them, and `shim.base_env` drops them again)
CREDENTIALS = frozenset({"PILOOP_HTTPS_TOKEN", "PILOOP_WORKER_CREDENTIAL", "PILOOP_REDIS_URL", "PILOOP_SECRET_KEY"})
CREDENTIAL_PREFIXES = ("PILOOP_STATE__",)  # `[plugins.state]` given in the environment (its url, its password)

_SYS_CREATE_RULESET, _SYS_RESTRICT_SELF = 444, 446  # the same on x86-64 and arm64 (the generic syscall table)
_ACCESS_FS_MAKE_BLOCK = 1 << 11
_PR_SET_NO_NEW_PRIVS = 38
try:  # loaded here, not in a forked child between fork and exec
    _libc: ctypes.CDLL | None = ctypes.CDLL(None, use_errno=True)
except OSError:
    _libc = None


def without_credentials(env: Mapping[str, str]) -> dict[str, str]:
    """`env` less every credential of the worker (`CREDENTIALS`)."""
    return {k: v for k, v in env.items() if k not in CREDENTIALS and not k.startswith(CREDENTIAL_PREFIXES)}


class JobUser(NamedTuple):
    """The user jobs run as: its ids, and its groups as `initgroups` would set them (read once, in the worker)."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]

    def wire(self) -> dict[str, Any]:
        """As it goes in a shim's request."""
        return {"name": self.name, "uid": self.uid, "gid": self.gid, "groups": list(self.groups)}

    @classmethod
    def of(cls, u: Mapping[str, Any] | None) -> JobUser | None:
        """The user of a shim's request (`ShimRequest.user`, as `wire` wrote it), or None (the job runs as the shim's
        user)."""
        if not u:
            return None
        return cls(str(u["name"]), int(u["uid"]), int(u["gid"]), tuple(int(g) for g in u["groups"]))


def resolve(name: str | None) -> JobUser | None:
    """The user `run_as` names; None when unset. ConfigError, one line naming the key, when this process is not
    root or the user does not exist (or is root)."""
    if not name:
        return None
    key = f"[plugins.executor] run_as = {name!r}"
    if os.geteuid() != 0:
        raise ConfigError(
            f"{key}: only a worker running as root runs its jobs as another user (this one is uid "
            f"{os.geteuid()}); remove the key or start the worker as root"
        )
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        raise ConfigError(f"{key}: there is no user {name!r} on this machine") from None
    if pw.pw_uid == 0:
        raise ConfigError(f"{key}: that user is root; name an unprivileged user")
    return JobUser(name, pw.pw_uid, pw.pw_gid, tuple(os.getgrouplist(name, pw.pw_gid)))


def hand_over(root: Path, user: JobUser, dirs: tuple[str, ...] = ("work", "outputs", "inputs", "workspace")) -> None:
    """Make the job's `dirs` (and all in them) the user's; the job's dir itself stays root's, 0711: the job passes
    through it (`..` from its cwd) but cannot replace its log or add files the worker would read as root."""
    os.chmod(root, 0o711)
    for name in dirs:
        top = root / name
        if not top.is_dir() or top.is_symlink():
            continue
        os.lchown(top, user.uid, user.gid)
        for base, subdirs, files in os.walk(top):
            for entry in (*subdirs, *files):
                os.lchown(os.path.join(base, entry), user.uid, user.gid)


def become(user: JobUser) -> None:
    """This (forked, not yet exec'd) process as `user`, for good: groups, gid, uid (the saved ids too)."""
    os.setgroups(list(user.groups))
    os.setresgid(user.gid, user.gid, user.gid)
    os.setresuid(user.uid, user.uid, user.uid)


def _syscall(*args: int | None) -> int:
    if _libc is None:
        return -1
    # every argument as a C long: a bare int would go as an int through syscall(2)'s varargs, cutting a pointer
    return int(_libc.syscall(*(ctypes.c_long(a or 0) for a in args)))


def available() -> bool:
    """Whether this kernel has Landlock (and lets this process use it)."""
    try:
        return _syscall(_SYS_CREATE_RULESET, None, 0, 1) >= 1  # LANDLOCK_CREATE_RULESET_VERSION: its ABI version
    except (OSError, AttributeError):
        return False


def isolate() -> None:
    """Put this process (a job's, between fork and exec) in a Landlock domain of its own; nothing where the kernel
    has none. Sets no_new_privs first, which an unprivileged process needs for it (and a job keeps: no setuid
    program gives it root back)."""
    try:
        prctl(_PR_SET_NO_NEW_PRIVS, 1)
        attr = ctypes.c_uint64(_ACCESS_FS_MAKE_BLOCK)
        fd = _syscall(_SYS_CREATE_RULESET, ctypes.addressof(attr), ctypes.sizeof(attr), 0)
        if fd < 0:
            return
        try:
            _syscall(_SYS_RESTRICT_SELF, fd, 0)
        finally:
            os.close(fd)
    except (OSError, AttributeError):
        return


__all__ = ["CREDENTIALS", "JobUser", "available", "become", "hand_over", "isolate", "resolve", "without_credentials"]
