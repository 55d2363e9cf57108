"""One job under its slot's supervisor: started, fenced, stopped, measured, and its end recorded.

The fencing rules are the shim's (docs/worker.md, "Fencing arithmetic"): past its deadline the job's group gets
SIGTERM and, after its kill grace, SIGKILL; a supervisor that wakes more than `LATE` past the deadline was frozen or
suspended, and SIGKILLs at once, no grace. The deadline is the slot record's for this job's generation once the worker
has written one, else the `start`'s. The supervisor's loop asks `next_wake()` for its timer and calls `wake()` when
the timer fires or one of `fds()` is readable; nothing polls on a tick.
"""

from __future__ import annotations

import contextlib
import os
import resource
import select
import signal
import threading
import time
from pathlib import Path

from piloop_worker import clock, jobtree, jobuser, metrics, tasks
from piloop_worker.cgroups import HeldWatch, JobCgroup, PeakWatch
from piloop_worker.records import ExitRecord, StopReason
from piloop_worker.slots.layout import SlotDir
from piloop_worker.slots.record import SlotRecord
from piloop_worker.slots.taskproc import TaskOutcome, TaskProcess
from piloop_worker.slots.wire import Ended, Holding, Start, Started
from piloop_worker.spawn import spawn
from piloop_worker.usage import Meter

# how late past its deadline a supervisor may wake before it counts as woken from a freeze, not a slow wake
LATE = 0.3
SAMPLE_EVERY = 0.5
FIRST_SAMPLE = 0.1  # a job that ends sooner is measured by its rusage alone (a sample walks all of /proc)
METRICS_AFTER = 1.0  # host metrics from a second into a job: a shorter one has none
POLL = 0.1  # the wake-up where the kernel gives no pidfd


class JobRun:
    """The slot's running job, from `begin()` to the `Ended` that `wake()` returns once it is over."""

    def __init__(
        self,
        start: Start,
        slot: SlotDir,
        record: SlotRecord,
        proc: TaskProcess,
        env: dict[str, str],
        log_fd: int,
        oom_counts: dict[str, int] | None = None,
    ) -> None:
        self.start, self.slot, self.record, self.proc = start, slot, record, proc
        # a slot's own group's OOM count at its last job's end (the supervisor's, kept across its jobs): the group
        # ran nothing since, so it is this job's count before it, without a read
        self.oom_counts: dict[str, int] = {} if oom_counts is None else oom_counts
        self.req = start.request
        self._env, self._log_fd = env, log_fd
        grant = self.req.cgroup
        self.cg = JobCgroup(Path(grant.path), grant.version) if grant is not None else None
        self.held = (
            HeldWatch(grant.limit_mb * 2**20, float(grant.held_seconds))
            if self.cg is not None and grant is not None and grant.limit_mb and grant.held_seconds
            else None
        )
        self.pid = 0
        self.pidfd: int | None = None
        self.task = bool(self.req.task)
        self.started_wall = time.time()
        self.started = clock.now()
        self.meter = Meter(os.getpid(), include_root=False)  # a subreaper: all it has is the job's (and its task's)
        self.why = StopReason.NONE
        self.asked: StopReason | None = None  # a `stop` from the worker, or the supervisor's SIGTERM
        self.kill_at: float | None = None
        self.killed = False
        self.next_sample = self.started + FIRST_SAMPLE
        self.metrics_at = self.started + METRICS_AFTER if self.req.metrics_seconds > 0 else None
        self._metrics: threading.Thread | None = None
        self._stop_metrics: threading.Event | None = None  # made with the thread: most jobs end before it starts
        self.oom_before = 0
        self.peak: PeakWatch | None = None
        self.outcome: TaskOutcome | None = None

    def holding(self) -> Holding:
        s = self.start
        return Holding(
            s.generation, s.job, s.token, self.pid, self.started_wall, str(self.cg.path) if self.cg else None, s.record
        )

    def begin(self, metrics_left: bool = False) -> Started | Ended:
        """Start the job: `Started`, or `Ended` at once when it cannot start. `metrics_left`: the last job ran long
        enough to write `metrics.jsonl`, which is emptied now."""
        if self.cg is not None:
            # a kept group's counters are an earlier job's too
            known = self.oom_counts.get(str(self.cg.path)) if self.cg.slots_own() else None
            self.oom_before = known if known is not None else self.cg.oom_kills()
            self.peak = self.cg.peak_watch()
        os.ftruncate(self._log_fd, 0)  # the same inode: `piloop attach` and the worker's offsets start again
        if metrics_left:
            with contextlib.suppress(OSError):
                os.truncate(self.slot.metrics, 0)
        self.slot.empty_work()
        cwd = self.req.cwd or str(self.slot.work)
        try:
            user = jobuser.JobUser.of(self.req.user)
            if user is not None:
                jobuser.hand_over(self.slot.root, user, dirs=("work", "outputs", "inputs", "workspace", "repo"))
            if self.task:
                self.pid = self.proc.start(self.req, cwd, str(self.slot.result_file(self.req.serializer)), self.cg)
                self.pidfd = self.proc.pidfd
            else:
                self.proc.retire()  # its end would kill every process under the supervisor: it goes first
                self.pid = self._spawn(cwd, user)
                with contextlib.suppress(OSError):
                    self.pidfd = os.pidfd_open(self.pid)
        except OSError as e:
            reason = str(e) if str(e).startswith("cannot start") else f"cannot start {self._what()!r}: {e}"
            self._close_peak()
            return Ended(self.start.generation, ExitRecord(exit_code=127, reason=reason, started=self.started_wall))
        return Started(self.start.generation, self.pid, self.started_wall)

    def fds(self) -> list[int]:
        found = [fd for fd in (self.pidfd,) if fd is not None]
        if self.task and self.proc.sock is not None:
            found.append(self.proc.sock.fileno())
        return found

    def next_wake(self) -> float:
        """The next `clock.now()` at which `wake()` has something to do, the job's end aside."""
        at = [self.next_sample]
        if self.pidfd is None:
            at.append(clock.now() + POLL)
        if not self.why:
            at.append(self.deadline())
            if self.req.timeout:
                at.append(self.started + float(self.req.timeout))
        elif not self.killed and self.kill_at is not None:
            at.append(self.kill_at)
        if self.metrics_at is not None:
            at.append(self.metrics_at)
        return min(at)

    def deadline(self) -> float:
        got = self.record.read()
        if got is not None and got.generation == self.start.generation:
            return got.deadline
        return self.start.deadline

    def stop(self, why: StopReason) -> None:
        """The worker's `stop`, or the supervisor's own end: acted on at the next `wake()`."""
        if self.asked is None:
            self.asked = why

    def wake(self) -> Ended | None:
        """Look at the job: its end (`Ended`), or fence, stop, sample it as due."""
        if self.task and self.outcome is None and (got := self.proc.outcome()) is not None:
            self.outcome = got
            if not self.proc.fresh:
                return self._end(0, None)  # the warm process lives on
        done, status, ru = self._reap()
        if done:
            if self.task and self.outcome is None:
                # what it sent before it exited is in its socket by now: read after the reap, not only before it,
                # or a task that answered and exited between the two looks would be taken for one that never did
                self.outcome = self.proc.outcome()
            if self.task and not self.proc.fresh:
                self.proc.gone()
            return self._end(status, ru)
        self._fence(clock.now())
        return None

    def _reap(self) -> tuple[int, int, resource.struct_rusage | None]:
        """wait4 of the job's process, when it has ended."""
        if self.pidfd is not None and not select.select([self.pidfd], [], [], 0)[0]:
            return 0, 0, None
        try:
            return os.wait4(self.pid, os.WNOHANG)
        except ChildProcessError:  # reaped already (a sweep of what a task left): it died by a signal
            return self.pid, signal.SIGKILL, None

    def _fence(self, now: float) -> None:
        if not self.why:
            deadline = self.deadline()
            if now > deadline + LATE:
                # woken past its deadline (the host was frozen or suspended): the lease may be handed on already,
                # so no grace, which would let the job run beside its next copy
                self.why = StopReason.FENCED
                jobtree.kill_now(self.pid, self.meter, self.cg)
                self.killed = True
            elif now > deadline:
                self.why = StopReason.FENCED
            elif self.asked is not None:
                self.why = self.asked
            elif self.req.timeout and now - self.started > float(self.req.timeout):
                self.why = StopReason.TIMEOUT
            if self.why and not self.killed:
                jobtree.signal_tree(self.pid, self.meter, signal.SIGTERM)
                self.kill_at = now + float(self.req.kill_grace)
        elif not self.killed and self.kill_at is not None and now >= self.kill_at:
            jobtree.kill_now(self.pid, self.meter, self.cg)
            self.killed = True
        if self.metrics_at is not None and now >= self.metrics_at:
            self.metrics_at = None
            self._start_metrics()
        if now >= self.next_sample:
            self.meter.sample()
            self.next_sample = now + SAMPLE_EVERY
            cg, held = self.cg, self.held
            if (
                held is not None
                and cg is not None
                and not self.why
                and held.observe(now, cg.usage_bytes(), cg.refaults())
            ):
                self.why = StopReason.MEMORY_HELD  # thrashing at its limit, which the kernel will not kill for
                jobtree.signal_tree(self.pid, self.meter, signal.SIGTERM)
                self.kill_at = now + float(self.req.kill_grace)

    def _end(self, status: int, ru: resource.struct_rusage | None) -> Ended:
        """The job is over: what it left killed and reaped, its usage and outcome recorded."""
        if self._metrics is not None and self._stop_metrics is not None:
            self._stop_metrics.set()
            self._metrics.join(5)
        got = self.outcome
        warm = self.task and not self.proc.fresh and got is not None
        left = True  # whether the job may have left a process in its cgroup
        if warm and got is not None:
            cpu, rss = got.cpu, got.rss
            self.proc.between_tasks(self.cg, self.req.warm_max_rss_mb, rss)
            keep = self.proc.pid
            # what the task left, not the warm process; nothing to look for when the process has no child and the
            # supervisor none but it (an orphan of the task's comes to the supervisor, its subreaper)
            left = got.children or self._metrics is not None or _own_children() != ({keep} if keep else set())
            if left:
                jobtree.reap_all(self.pid, 2.0, keep=keep)
        else:
            cpu, rss = (ru.ru_utime + ru.ru_stime, ru.ru_maxrss * 1024) if ru is not None else (0.0, 0)
            jobtree.signal_tree(self.pid, self.meter, signal.SIGKILL)
            left = _own_children() != set()  # its process reaped: any other is what it left
        if self.cg is not None and left:  # a process of the job's is a descendant, here or in the warm process
            self.cg.kill_all()
        if not warm:
            if self.pidfd is not None and not self.task:
                os.close(self.pidfd)
            if self.task and self.proc.fresh:
                self.proc.gone()
            jobtree.reap_all(self.pid, 2.0)
        oom, reason = False, ""
        if self.cg is not None:
            count = self.cg.oom_kills()
            self.oom_counts[str(self.cg.path)] = count
            oom = count > self.oom_before or self.why is StopReason.MEMORY_HELD
            if self.why is StopReason.MEMORY_HELD and self.req.cgroup is not None:
                reason = f"out of memory (held at its limit for {self.req.cgroup.held_seconds:g}s)"
        exit_code = got.code if got is not None else os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
        signalled = os.WTERMSIG(status) if got is None and os.WIFSIGNALED(status) else None
        # a warm process is the slot's, shared by its tasks: one killed from outside under a task (the host's OOM
        # killer, an operator) is lost like a worker, and its task queued again, not failed for what it did
        lost = (
            self.task
            and not self.proc.fresh
            and got is None
            and not self.why
            and not oom
            and signalled in (signal.SIGKILL, signal.SIGTERM)
        )
        if lost and signalled is not None:
            reason = f"its warm task process was killed by {signal.Signals(signalled).name} from outside"
        elif self.task and got is None and not self.why and not reason and exit_code == 0:
            reason = "its task's process exited (status 0) before the task returned"  # os._exit(0): no value
        error: tuple[str, ...] = ()
        if got is not None and not self.why and got.code == tasks.FAILED:
            reason = reason or got.reason
            error = got.classes
        usage = self.meter.usage(cpu, rss, without=self.pid if warm else None)
        if self.peak is not None and (most := self.peak.peak_bytes()) is not None:
            usage = usage._replace(peak_rss_bytes=most)
        self._close_peak()
        record = ExitRecord(
            exit_code=exit_code,
            signal=signalled,
            oom=oom,
            stopped=self.why,
            lost=bool(lost),
            reason=reason,
            usage=usage,
            duration_seconds=round(clock.now() - self.started, 3),
            error=error,
            started=self.started_wall,
            ended=time.time(),
        )
        value = got.value if got is not None and not self.why else None
        value_file = got.value_file if got is not None and not self.why else None
        failure = got.error if got is not None and not self.why else None
        return Ended(self.start.generation, record, value, value_file, error=failure)

    def _spawn(self, cwd: str, user: jobuser.JobUser | None) -> int:
        procs = os.open(self.cg.join_path(), os.O_WRONLY | os.O_CLOEXEC) if self.cg is not None else None
        try:
            return spawn(
                self.req.argv,
                env={**self._env, **self.req.env},
                cwd=cwd,
                stdin=_devnull(),
                stdout=self._log_fd,
                stderr=self._log_fd,
                cgroup_procs=procs,
                user=user,
            )
        finally:
            if procs is not None:
                os.close(procs)

    def _start_metrics(self) -> None:
        every = float(self.req.metrics_seconds)
        path, disk = self.slot.metrics, self.slot.root
        stop = self._stop_metrics = threading.Event()

        def loop() -> None:
            while not stop.is_set():
                with contextlib.suppress(Exception):
                    metrics.append(path, disk)
                stop.wait(every)

        self._metrics = threading.Thread(target=loop, name="metrics", daemon=True)
        self._metrics.start()

    @property
    def wrote_metrics(self) -> bool:
        return self._metrics is not None

    def _close_peak(self) -> None:
        if self.peak is not None:
            self.peak.close()
            self.peak = None

    def _what(self) -> str:
        return self.req.task or (self.req.argv[0] if self.req.argv else "")


def _own_children() -> set[int] | None:
    """This process's children, from its main thread's list (the metrics thread, which has none, aside); None where
    the kernel does not list them."""
    try:
        fd = os.open(f"/proc/self/task/{os.getpid()}/children", os.O_RDONLY | os.O_CLOEXEC)
        try:
            return {int(c) for c in os.read(fd, 1 << 16).split()}
        finally:
            os.close(fd)
    except (OSError, ValueError):
        return None


_DEVNULL: list[int] = []


def _devnull() -> int:
    if not _DEVNULL:
        _DEVNULL.append(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
    return _DEVNULL[0]


__all__ = ["LATE", "JobRun"]
