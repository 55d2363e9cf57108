"""A cgroup v1 freezer group of a test's own: what is moved into it stops at once and goes on at once, as a machine's
processes do across a suspend (unlike SIGSTOP, which lands on each process in turn and which a process can see)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import psutil

from tests.helpers.redis import wait_for

FREEZER = Path("/sys/fs/cgroup/freezer")


def tree(pid: int) -> set[int]:
    """`pid`, its descendants, and every process of its process group (a detached child keeps the group)."""
    out = {pid}
    try:
        out |= {c.pid for c in psutil.Process(pid).children(recursive=True)}
    except psutil.Error:
        pass
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pid:
                out.add(p.pid)
        except (ProcessLookupError, psutil.Error):
            continue
    return out


def group(pgid: int) -> set[int]:
    """The live processes of one process group."""
    out = set()
    for p in psutil.process_iter(["status"]):
        try:
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                out.add(p.pid)
        except (ProcessLookupError, psutil.Error):
            continue
    return out


class Freezer:
    """`/sys/fs/cgroup/freezer/<name>`: `add` moves whole processes (every thread: `cgroup.procs`, not `tasks`);
    `close` thaws, moves them back to the root group and removes the group."""

    def __init__(self, name: str) -> None:
        self.path = FREEZER / name

    @classmethod
    def open(cls, name: str) -> tuple[Freezer | None, str]:
        """A new group, or None and why none can be made here."""
        f = cls(name)
        try:
            f.path.mkdir()
        except OSError as e:
            return None, f"cannot make a freezer cgroup at {f.path}: {e}"
        try:
            (f.path / "freezer.state").write_text("THAWED")
        except OSError as e:
            f.path.rmdir()
            return None, f"cannot write {f.path / 'freezer.state'}: {e}"
        return f, ""

    def procs(self) -> set[int]:
        return {int(p) for p in (self.path / "cgroup.procs").read_text().split()}

    def add(self, pids: set[int]) -> None:
        for pid in sorted(pids):
            try:
                (self.path / "cgroup.procs").write_text(str(pid))
            except OSError as e:
                if e.errno != errno.ESRCH:  # it ended meanwhile
                    raise

    def state(self) -> str:
        return (self.path / "freezer.state").read_text().strip()

    def freeze(self) -> None:
        (self.path / "freezer.state").write_text("FROZEN")
        wait_for(lambda: self.state() == "FROZEN", 10, interval=0.01, what=f"{self.path} to be FROZEN")

    def thaw(self) -> None:
        (self.path / "freezer.state").write_text("THAWED")
        wait_for(lambda: self.state() == "THAWED", 10, interval=0.01, what=f"{self.path} to be THAWED")

    def close(self) -> None:
        if not self.path.exists():
            return
        self.thaw()
        for pid in self.procs():
            try:
                (FREEZER / "cgroup.procs").write_text(str(pid))
            except OSError as e:
                if e.errno != errno.ESRCH:
                    raise
        wait_for(lambda: not self.procs(), 10, interval=0.01, what=f"{self.path} to be empty")
        self.path.rmdir()
