"""The worker's side of one slot: its supervisor started or found, and spoken to over the slot's socket.

    slot = SlotHandle(SlotDir.of(workdir, 0))
    state = slot.open()                      # started when its lock is free, else the live one (a restarted worker)
    slot.start(generation=1, job=..., token=..., deadline=..., request=SlotRequest(argv=["true"]))
    slot.write_deadline(1, deadline)         # at each acknowledged heartbeat: the mapped record, no system call
    for msg in slot.read():                  # when `slot.fileno()` is readable: Started, Ended, State, Gone
        ...
    slot.ack(1)                              # the report spooled or answered: the supervisor forgets the job

A supervisor that dies is seen here (the connection closes): `read()` gives the held job's end as `lost` (what is
left of its process group and cgroup killed first, as `fencing.bury` does for a shim) and then `Gone`.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import select
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

import psutil

from piloop_common.errors import Unavailable
from piloop_worker import clock, jobuser
from piloop_worker.cgroups import JobCgroup
from piloop_worker.records import ExitRecord, StopReason
from piloop_worker.slots.layout import SlotDir
from piloop_worker.slots.record import SlotRecord
from piloop_worker.slots.wire import (
    MAX_DATAGRAM,
    Ack,
    Bye,
    Ended,
    Hello,
    Holding,
    Message,
    SlotRequest,
    Start,
    Started,
    State,
    Stop,
    WireError,
    encode,
    parse,
)
from piloop_worker.spawn import spawn

OPEN_SECONDS = 30.0  # how long `open` waits for a supervisor to answer (a loaded host starts Python slowly)
SAY_AFTER = 2.0  # a wait longer than this is logged once, saying what it waits for
log = logging.getLogger("piloop.worker")


class Gone(NamedTuple):
    """The slot's supervisor died (its connection closed): the slot must be opened again."""

    pid: int


class SlotHandle:
    """One slot's supervisor, from the worker."""

    def __init__(self, slot: SlotDir, python: str = sys.executable) -> None:
        self.slot = slot
        self.python = python
        self.sock: socket.socket | None = None
        self.record: SlotRecord | None = None
        self.pid = 0  # the supervisor's
        self.holding: Holding | None = None
        self._grants: dict[int, str | None] = {}  # generation → its cgroup: every start sent and not yet ended
        self._spawned: int | None = None  # a supervisor this process started: reaped once it ends

    def open(self, timeout: float = OPEN_SECONDS) -> State:
        """Connect to the slot's supervisor, starting one when none holds the lock; its `State`."""
        self.slot.make()
        self.record = self.record or SlotRecord.open(self.slot.record)
        end = clock.now() + timeout
        said = False
        started_at = clock.now()
        why = "the supervisor holding its lock to listen"
        while True:
            pause = 0.02
            if not self._locked():
                pid = self._spawned = self._start_supervisor()
                why = f"the supervisor it started (pid {pid}) to listen"
                if self._exited():
                    why = f"a supervisor: the one it started (pid {pid}) exited at once"
                    pause = 0.5  # not a new interpreter every few ms while it keeps failing
            try:
                self._connect()
                break
            except OSError as e:
                error = e.strerror or str(e)
            now = clock.now()
            if now >= end:
                raise Unavailable(
                    f"slot {self.slot.root}: no supervisor answered in {timeout:g}s (waited for {why}: {error}); "
                    f"see {self.slot.supervisor_log}"
                )
            if not said and now - started_at > SAY_AFTER:
                log.info("event=slot.waiting slot=%s for=%s", self.slot.root, why)
                said = True
            time.sleep(pause)
        self.pid = self._lock_pid()
        self._send(Hello())
        return self._await_state(end)

    def start(
        self,
        generation: int,
        job: str,
        token: str,
        deadline: float,
        request: SlotRequest,
        record: dict[str, Any] | None = None,
    ) -> None:
        self._grants[generation] = request.cgroup.path if request.cgroup is not None else None
        self._send(Start(generation, job, token, deadline, request, record))

    def write_deadline(self, generation: int, deadline: float) -> None:
        assert self.record is not None, "open() the slot first"
        self.record.write(generation, deadline)

    def stop(self, generation: int, reason: StopReason) -> None:
        self._send(Stop(generation, reason))

    def ack(self, generation: int) -> None:
        self._send(Ack(generation))

    def bye(self) -> None:
        with contextlib.suppress(OSError):
            self._send(Bye())

    def fileno(self) -> int:
        assert self.sock is not None, "open() the slot first"
        return self.sock.fileno()

    def read(self, timeout: float = 0.0) -> list[Message | Gone]:
        """The messages waiting (up to `timeout` for the first); the supervisor's death as a lost `Ended` (when it
        held a job) and `Gone`."""
        if self.sock is None:
            return []
        got: list[Message | Gone] = []
        if timeout > 0 and not select.select([self.sock], [], [], timeout)[0]:
            return got
        while self.sock is not None:
            try:
                raw = self.sock.recv(MAX_DATAGRAM, socket.MSG_DONTWAIT)
            except BlockingIOError:
                break
            except OSError:
                raw = b""
            if not raw:
                got.extend(self._gone())
                break
            try:
                msg = parse(raw)
            except WireError as e:
                log.warning("event=slot.bad_message slot=%s error=%s", self.slot.root, e)
                continue
            self._note(msg)
            got.append(msg)
        return got

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.record is not None:
            self.record.close()
            self.record = None
        self._reap()

    def _note(self, msg: Message) -> None:
        if isinstance(msg, Started):
            self.holding = Holding(msg.generation, "", "", msg.pid, msg.started, self._grants.get(msg.generation))
        elif isinstance(msg, State):
            self.holding = msg.holding
            if msg.holding is not None:  # adopted: ended here if its supervisor dies
                self._grants[msg.holding.generation] = msg.holding.cgroup
        elif isinstance(msg, Ended):
            self._grants.pop(msg.generation, None)
            if self.holding is not None and self.holding.generation == msg.generation:
                self.holding = None

    def _gone(self) -> list[Message | Gone]:
        """The supervisor died: what is left of its job killed, and the job recorded lost."""
        assert self.sock is not None
        self.sock.close()
        self.sock = None
        self._reap()
        out: list[Message | Gone] = []
        held = self.holding
        if held is not None:
            _bury(held)
        why = "the slot's supervisor died before the job ended"
        for generation in sorted(self._grants):  # a start it may never have read is lost too, never run
            started = held.started if held is not None and held.generation == generation else None
            out.append(Ended(generation, ExitRecord(lost=True, reason=why, started=started)))
        self._grants.clear()
        self.holding = None
        log.warning("event=slot.supervisor_gone slot=%s pid=%s holding=%s", self.slot.root, self.pid, held is not None)
        out.append(Gone(self.pid))
        return out

    def _send(self, msg: Message) -> None:
        """Send `msg`; a supervisor that died meanwhile is not an error here: `read()` reports it (`Gone`)."""
        if self.sock is None:
            raise Unavailable(f"slot {self.slot.root}: not connected to its supervisor")
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.sock.send(encode(msg))

    def _await_state(self, end: float) -> State:
        while True:
            for msg in self.read(timeout=max(end - clock.now(), 0.01)):
                if isinstance(msg, State):
                    return msg
                if isinstance(msg, Gone):
                    raise Unavailable(f"slot {self.slot.root}: its supervisor ended; see {self.slot.supervisor_log}")
            if clock.now() >= end:
                raise Unavailable(f"slot {self.slot.root}: its supervisor did not answer hello")

    def alive(self) -> bool:
        """Whether a supervisor holds the slot (its lock)."""
        return self.slot.lock.exists() and self._locked()

    def _locked(self) -> bool:
        """Whether a supervisor holds the slot's lock."""
        fd = os.open(self.slot.lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # released with it
        return False

    def _lock_pid(self) -> int:
        with contextlib.suppress(OSError, ValueError):
            return int(self.slot.lock.read_text().split()[0])
        return 0

    def _start_supervisor(self) -> int:
        """A supervisor for the slot, started; its pid, once it holds the lock or has exited."""
        self._reap()
        out = os.open(self.slot.supervisor_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        devnull = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        try:
            pid = spawn(
                [self.python, "-m", "piloop_worker.slots.supervisor", str(self.slot.root)],
                env=jobuser.without_credentials(os.environ),
                cwd=self.slot.root,
                stdin=devnull,
                stdout=out,
                stderr=out,
                new_session=True,  # outlives this worker
                pdeathsig=None,
            )
        finally:
            os.close(out)
            os.close(devnull)
        # until it holds its lock, the next look would start another (which would exit at once: harmless)
        # (a new interpreter takes a second or more on a loaded host: looks that back off to 50 ms cost it little)
        end = clock.now() + OPEN_SECONDS
        pause = 0.005
        while not self._locked() and clock.now() < end and not os.waitpid(pid, os.WNOHANG)[0]:
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
        return pid

    def _exited(self) -> bool:
        """Whether the supervisor this process started has ended (and is reaped now)."""
        if self._spawned is None:
            return False
        try:
            done = os.waitpid(self._spawned, os.WNOHANG)[0]
        except ChildProcessError:
            done = 1  # reaped by the wait above
        if done:
            self._spawned = None
        return bool(done)

    def _connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, MAX_DATAGRAM)
        path = str(self.slot.sock)
        dirfd = None
        if len(path.encode()) >= 100:  # over AF_UNIX's 108: through this process's descriptor of the dir
            dirfd = os.open(self.slot.root, os.O_PATH | os.O_CLOEXEC)
            path = f"/proc/self/fd/{dirfd}/{self.slot.sock.name}"
        try:
            sock.connect(path)
        except OSError:
            sock.close()
            raise
        finally:
            if dirfd is not None:
                os.close(dirfd)
        if self.sock is not None:
            self.sock.close()
        self.sock = sock

    def _reap(self) -> None:
        if self._spawned is not None:
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(self._spawned, os.WNOHANG)[0]:
                    self._spawned = None


def _bury(held: Holding) -> None:
    """Kill what is left of a job whose supervisor died: its process group (when it is still that job's) and cgroup."""
    with contextlib.suppress(psutil.Error, OSError):
        # a warm task process was made before its task started; a later process with the pid, after
        if psutil.Process(held.pid).create_time() <= held.started + 2:
            os.killpg(held.pid, signal.SIGKILL)
    if held.cgroup:
        JobCgroup(Path(held.cgroup), 2 if Path(held.cgroup, "cgroup.kill").exists() else 1).kill_all()


__all__ = ["OPEN_SECONDS", "Gone", "SlotHandle"]
