"""A slot supervisor for a test: a `SlotHandle` on a slot under the test's tmp dir, jobs run to their end, and the
supervisor killed at the test's end whatever it asserted."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from typing import Any

from piloop_worker import clock
from piloop_worker.slots import SlotDir, SlotHandle, SlotRequest
from piloop_worker.slots.handle import Gone
from piloop_worker.slots.wire import Ended, Message, Started, State
from tests.helpers.slowdown import scaled

ROOT = Path(__file__).resolve().parents[2]
TASKS = "tests.helpers.slot_tasks"
ENV = {"PYTHONPATH": str(ROOT)}  # where the task process finds `tests.helpers.slot_tasks`


def task(name: str, *args: Any, warm: int = 1000, **kw: Any) -> SlotRequest:
    """A request for `slot_tasks.<name>(*args)` (warm unless `warm=0`), arguments inline as JSON."""
    import json

    extra = {k: kw.pop(k) for k in list(kw) if k in SlotRequest._fields}
    body = json.dumps({"args": list(args), "kwargs": kw}).encode()
    return SlotRequest(argv=[], env=ENV, task=f"{TASKS}:{name}", args=body, warm_max_tasks=warm, **extra)


def process(*argv: str, **kw: Any) -> SlotRequest:
    return SlotRequest(argv=list(argv), env=ENV, **kw)


class Slot:
    """One slot and its handle; `run` starts a job and waits for its end."""

    def __init__(self, root: Path) -> None:
        self.dir = SlotDir(root)
        self.handle = SlotHandle(self.dir)
        self.generation = 0
        self.pids: set[int] = set()  # every supervisor seen: killed at the end
        self.pending: list[Message | Gone] = []  # read, not yet waited for

    def open(self, timeout: float = 30.0) -> State:
        state = self.handle.open(timeout=scaled(timeout))
        self.pids.add(self.handle.pid)
        return state

    def start(self, req: SlotRequest, deadline_in: float = 60.0) -> int:
        self.generation += 1
        self.handle.start(self.generation, f"job{self.generation}", "token", clock.now() + deadline_in, req)
        return self.generation

    def wait(self, kind: type | tuple[type, ...], generation: int | None = None, timeout: float = 20.0) -> Any:
        """The next message of `kind` (for `generation`, when given); AssertionError after `timeout` (scaled)."""
        end = clock.now() + scaled(timeout)
        while True:
            for i, msg in enumerate(self.pending):
                if isinstance(msg, kind) and (generation is None or getattr(msg, "generation", None) == generation):
                    del self.pending[i]
                    return msg
                if isinstance(msg, Gone) and not (isinstance(kind, type) and issubclass(Gone, kind)):
                    raise AssertionError(f"the supervisor died waiting for {kind} of {generation}")
            if clock.now() >= end:
                raise AssertionError(f"timed out after {scaled(timeout):g}s waiting for {kind} of {generation}")
            self.pending.extend(self.handle.read(timeout=min(0.5, max(end - clock.now(), 0.01))))

    def run(self, req: SlotRequest, deadline_in: float = 60.0, timeout: float = 20.0) -> tuple[Started, Ended]:
        g = self.start(req, deadline_in)
        started: Started | Ended = self.wait((Started, Ended), g, timeout)
        if isinstance(started, Ended):
            self.handle.ack(g)
            raise AssertionError(f"job {g} did not start: {started.exit}")
        ended = self.wait(Ended, g, timeout)
        self.handle.ack(g)
        return started, ended

    def log(self) -> str:
        return self.dir.output_log.read_text()

    def supervisor_log(self) -> str:
        return self.dir.supervisor_log.read_text() if self.dir.supervisor_log.exists() else ""

    def kill(self) -> None:
        """SIGKILL every supervisor this slot had; the handle closed."""
        self.handle.close()
        for pid in self.pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)  # one this process started: not left a zombie for the session


def messages(slot: Slot, timeout: float = 0.5) -> list[Message | Gone]:
    return slot.handle.read(timeout=timeout)


def alive(pid: int) -> bool:
    """Running: not gone, not a zombie waiting for its reaper."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def group_alive(pgid: int) -> bool:
    """Whether a process of group `pgid` still runs (a zombie waiting for its reaper does not count)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            return True
    return False


def inodes(root: Path) -> set[tuple[str, int]]:
    """Every file and dir under `root`, with its inode: a file made and removed between two looks changes it."""
    found = {(str(root), os.stat(root).st_ino)}
    for base, dirs, files in os.walk(root):
        for name in (*dirs, *files):
            p = os.path.join(base, name)
            found.add((p, os.lstat(p).st_ino))
    return found
