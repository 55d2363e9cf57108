"""A slot's supervisor: one long-lived process per slot, reused for every job the slot runs (docs/worker.md, "Slots").

    python -m piloop_worker.slots.supervisor <slotdir>

It takes the slot's `lock` (a second supervisor on the slot exits at once, 0), becomes a child subreaper, ignores
SIGINT and SIGHUP, listens on `sock`, and runs one selectors loop over the listening socket, the connected worker,
the job's pidfd and the task process's socket. Its timer is the nearest of the job's deadline (re-read from the
slot's record at each wake), its timeout, its kill grace and its next usage sample. It runs in its own session (the
worker starts it so), so it outlives a worker that dies; the job can never outlive it (a parent-death signal, and it
is the job's reaper).

A job's end goes to the connected worker (`Ended`), else to `ended.json`, and is kept until the worker's `ack`. A
supervisor with no worker connected and no job for `IDLE_EXIT_SECONDS` exits; after a `bye`, at once when idle.
A SIGTERM stops the job (`supervisor terminated`), records its end, and exits.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import selectors
import signal
import socket
import sys
from pathlib import Path

from piloop_common.prctl import PR_SET_CHILD_SUBREAPER, prctl, set_name
from piloop_worker import clock, jobuser, tasks
from piloop_worker.records import ExitRecord, StopReason, atomic_write
from piloop_worker.slots.job import POLL, JobRun
from piloop_worker.slots.layout import SlotDir
from piloop_worker.slots.record import SlotRecord
from piloop_worker.slots.taskproc import TaskProcess
from piloop_worker.slots.timer import BootTimer
from piloop_worker.slots.wire import (
    MAX_DATAGRAM,
    Ack,
    Bye,
    Ended,
    Hello,
    Message,
    Start,
    State,
    Stop,
    WireError,
    encode,
    parse,
)

IDLE_EXIT_SECONDS = 60.0  # no worker and no job this long (after a lost connection, or since its start): exit
# `ended.json` is fsynced when a job in it ran this long, the spool's rule (docs/worker.md, "Reports and the spool"):
# a shorter job whose end a crash of the machine loses runs again once its lease expires
DURABLE_AFTER_SECONDS = 1.0
log = logging.getLogger("piloop.slot")


class Supervisor:
    def __init__(self, slot: SlotDir, listener: socket.socket, record: SlotRecord, log_fd: int) -> None:
        self.slot, self.listener, self.record, self.log_fd = slot, listener, record, log_fd
        self.env = dict(os.environ)  # already without the worker's credentials (`main`)
        self.proc = TaskProcess(log_fd)
        self.sel = selectors.DefaultSelector()
        self.sel.register(listener, selectors.EVENT_READ, "listen")
        self.conn: socket.socket | None = None
        self.job: JobRun | None = None
        self._job_fds: list[int] = []
        self.oom_counts: dict[str, int] = {}  # a slot's group → its OOM count at its last job's end (`JobRun`)
        self.unacked: dict[int, Ended] = {e.generation: e for e in _read_ended(slot.ended)}
        self.ended_on_disk = bool(self.unacked)
        self.leaving = False  # a `bye`: exit once idle
        self.metrics_left = True  # `metrics.jsonl` may hold an earlier job's samples (emptied at the next start)
        self.terminated = False
        self.idle_since = clock.now()
        wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(self._wake_w)
        self.sel.register(wake_r, selectors.EVENT_READ, "signal")
        self.timer = BootTimer.open()  # the job's next wake, a suspend counted (`timer.py`)
        if self.timer is not None:
            self.sel.register(self.timer, selectors.EVENT_READ, "timer")
        signal.signal(signal.SIGTERM, self._on_term)

    def _on_term(self, *_: object) -> None:
        self.terminated = True

    def run(self) -> None:
        while True:
            now = clock.now()
            if self.job is None and self._should_exit(now):
                break
            timeout = None
            if self.job is not None:
                at = self.job.next_wake()
                if self.timer is not None:
                    self.timer.arm(at)
                else:
                    timeout = max(min(at - now, POLL), 0.0)
            elif self.conn is None:
                timeout = max(self.idle_since + IDLE_EXIT_SECONDS - now, 0.0)
            for key, _ in self.sel.select(timeout):
                what = key.data
                if what == "listen":
                    self._accept()
                elif what == "conn":
                    self._receive()
                elif what == "timer" and self.timer is not None:
                    self.timer.drain()
                elif what == "signal":
                    with contextlib.suppress(OSError):
                        os.read(key.fd, 64)
            if self.terminated and self.job is not None:
                self.job.stop(StopReason.SUPERVISOR_TERMINATED)
            if self.job is not None and (ended := self.job.wake()) is not None:
                self._finish(ended.of(self.job.start))
        self._save_ended()

    def _should_exit(self, now: float) -> bool:
        if self.terminated:
            return True
        if self.leaving and self.conn is None:
            return True
        return self.conn is None and now - self.idle_since >= IDLE_EXIT_SECONDS

    def _accept(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        if self.conn is not None:  # a restarted worker: the new connection replaces the old one
            log.info("event=slot.worker_replaced slot=%s", self.slot.root)
            self._drop_conn()
        conn.setblocking(False)
        with contextlib.suppress(OSError):
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, MAX_DATAGRAM)
        self.conn = conn
        self.leaving = False
        self.sel.register(conn, selectors.EVENT_READ, "conn")

    def _drop_conn(self) -> None:
        if self.conn is None:
            return
        self.sel.unregister(self.conn)
        self.conn.close()
        self.conn = None
        self.idle_since = clock.now()
        self._save_ended()

    def _receive(self) -> None:
        while self.conn is not None:
            try:
                raw = self.conn.recv(MAX_DATAGRAM)
            except BlockingIOError:
                return
            except OSError:
                raw = b""
            if not raw:
                log.info("event=slot.worker_gone slot=%s holding=%s", self.slot.root, self.job is not None)
                self._drop_conn()
                return
            try:
                msg = parse(raw)
            except WireError as e:
                log.warning("event=slot.bad_message slot=%s error=%s", self.slot.root, e)
                continue
            self._handle(msg)

    def _handle(self, msg: Message) -> None:
        if isinstance(msg, Hello):
            self._send(State(self.job.holding() if self.job is not None else None, list(self.unacked.values())))
        elif isinstance(msg, Start):
            self._start(msg)
        elif isinstance(msg, Stop):
            if self.job is not None and self.job.start.generation == msg.generation:
                self.job.stop(msg.reason)
        elif isinstance(msg, Ack):
            if self.unacked.pop(msg.generation, None) is not None and self.ended_on_disk:
                self._save_ended()
        elif isinstance(msg, Bye):
            self.leaving = True
        else:
            log.warning("event=slot.bad_message slot=%s error=%s", self.slot.root, f"{type(msg).__name__} is ours")

    def _start(self, start: Start) -> None:
        if self.job is not None:
            # a worker's mistake: the slot runs one job; this one is given back, never run beside the other
            why = f"the slot holds job generation {self.job.start.generation}"
            self._send(Ended(start.generation, ExitRecord(lost=True, reason=why)).of(start))
            return
        job = JobRun(start, self.slot, self.record, self.proc, self.env, self.log_fd, self.oom_counts)
        begun = job.begin(self.metrics_left)
        self.metrics_left = False
        if isinstance(begun, Ended):
            self._finish(begun.of(start))
            return
        self.job = job
        self._job_fds = job.fds()
        for fd in self._job_fds:
            self.sel.register(fd, selectors.EVENT_READ, "job")
        self._send(begun)

    def _finish(self, ended: Ended) -> None:
        if self.job is not None and self.job.wrote_metrics:
            self.metrics_left = True
        for fd in self._job_fds:
            with contextlib.suppress(KeyError, ValueError):
                self.sel.unregister(fd)
        self._job_fds = []
        self.job = None
        self.idle_since = clock.now()
        self.unacked[ended.generation] = ended
        if self.conn is None or not self._send(ended):
            self._save_ended()

    def _send(self, msg: Message) -> bool:
        """Whether `msg` reached the connected worker."""
        if self.conn is None:
            return False
        try:
            self.conn.send(encode(msg))
        except BlockingIOError:
            # a worker that reads nothing (stopped): its next hello gets the state, ended jobs included
            log.warning("event=slot.send_full slot=%s message=%s", self.slot.root, type(msg).__name__)
            return False
        except OSError:
            self._drop_conn()
            return False
        return True

    def _save_ended(self) -> None:
        """`ended.json` holds the unacknowledged ends, or is removed when there are none."""
        try:
            if self.unacked:
                data = json.dumps([json.loads(encode(e)) for e in self.unacked.values()])
                durable = any(e.exit.duration_seconds >= DURABLE_AFTER_SECONDS for e in self.unacked.values())
                atomic_write(self.slot.ended, data, durable=durable)
                self.ended_on_disk = True
            elif self.ended_on_disk:
                with contextlib.suppress(FileNotFoundError):
                    self.slot.ended.unlink()
                self.ended_on_disk = False
        except OSError as e:
            log.warning("event=slot.ended_unwritten slot=%s error=%s", self.slot.root, e)


def _read_ended(path: Path) -> list[Ended]:
    try:
        raw = json.loads(path.read_bytes())
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as e:
        log.warning("event=slot.ended_unreadable path=%s error=%s", path, e)
        return []
    found: list[Ended] = []
    for item in raw if isinstance(raw, list) else []:
        try:
            msg = parse(json.dumps(item).encode())
        except WireError:
            continue
        if isinstance(msg, Ended):
            found.append(msg)
    return found


def _take_lock(slot: SlotDir) -> int | None:
    """The slot's lock, held for this process's life (its pid written in it); None when another supervisor has it."""
    fd = os.open(slot.lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def listen(slot: SlotDir) -> socket.socket:
    """The control socket, bound relative to the slot's dir (this process's cwd) so a long `--dir` still fits."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(slot.sock.name)  # an earlier supervisor's: we hold the lock, so it is no one's now
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    old = os.umask(0o177)
    try:
        sock.bind(slot.sock.name)
    finally:
        os.umask(old)
    os.chmod(slot.sock.name, 0o600)
    sock.listen(4)
    sock.setblocking(False)
    return sock


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m piloop_worker.slots.supervisor <slotdir>", file=sys.stderr)
        return 2
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(message)s")
    slot = SlotDir(Path(args[0]).absolute())
    slot.make()
    lock = _take_lock(slot)
    if lock is None:
        log.info("event=slot.supervisor_exists slot=%s pid=%s", slot.root, os.getpid())
        return 0
    os.chdir(slot.root)
    set_name("piloop-slot")
    prctl(PR_SET_CHILD_SUBREAPER, 1)  # the job's orphans come here (not to init): seen, killed and reaped
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    tasks.use_start(os.environ.pop(tasks.START_ENV, ""))  # before a task process is forked: they inherit both
    tasks.use_path(os.environ.pop(tasks.PATH_ENV, ""))
    for name in set(os.environ) - set(jobuser.without_credentials(os.environ)):
        del os.environ[name]  # nor in a job, nor in a task process, which inherits os.environ
    log_fd = os.open(slot.output_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    record = SlotRecord.open(slot.record)
    listener = listen(slot)
    log.info("event=slot.supervisor_started slot=%s pid=%s", slot.root, os.getpid())
    sup = Supervisor(slot, listener, record, log_fd)
    try:
        sup.run()
    finally:
        sup.proc.retire()
        with contextlib.suppress(OSError):
            os.unlink(slot.sock.name)
    log.info("event=slot.supervisor_exited slot=%s pid=%s", slot.root, os.getpid())
    return 0


if __name__ == "__main__":
    sys.exit(main())
