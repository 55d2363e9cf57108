"""The per-job supervisor: forked from the shim host, it runs one job and fences it on its own.

It is its own session leader (it outlives the worker and the shim host), runs the job in a process group
of its own, and every ~100 ms compares CLOCK_BOOTTIME (`clock.now`, which counts a suspend) with the `deadline`
the worker last wrote: past it, the job's whole group gets SIGTERM, then SIGKILL after the kill grace; woken well
past it (a frozen or suspended host), SIGKILL at once. So a job dies by its deadline whatever else has died, and
never runs beside the copy the server hands on after its lease expires. The job's leader dies with the shim
(a parent-death signal), so a shim killed with its worker leaves no job running unsupervised.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from piloop_common.prctl import PR_SET_CHILD_SUBREAPER, die_with_parent, prctl, set_name
from piloop_worker import clock, jobtree, jobuser, metrics, spawning, tasks, warm
from piloop_worker.cgroups import HeldWatch, JobCgroup
from piloop_worker.jobdir import JobDir
from piloop_worker.shimproto import ExitRecord, ShimRecord, ShimRequest, StopReason
from piloop_worker.usage import Meter

TICK = 0.1
# how late past its deadline a shim may look before it counts as woken from a freeze, not just a slow tick
LATE = 3 * TICK
NOTIFY_ENV = "PILOOP_SHIM_NOTIFY_FD"  # the shims' end of the worker's wake-up socket pair (see shimhost.py)
SAMPLE_EVERY = 0.5
FIRST_SAMPLE = 0.1
# host metrics from a second into a job: a shorter one has none (and no metrics blob to store), which spares each
# short job a thread, a sample of the host and a file (see docs/worker.md)
METRICS_AFTER = 1.0
JOBS_PER_SHIM = 1000  # then a fresh fork: whatever a long life gathers (fragmented heap, caches) starts again
MAX_REQUEST = 1 << 20  # above a packet's most (the send buffer's size): a request too large to send gets a fork


_notify: socket.socket | None = None
_base_env: dict[str, str] | None = None  # the host's environment (`base_env`)
_terminated = threading.Event()  # a SIGTERM came: the job running stops, and the shim takes no other
WARM = warm.Warm()  # this shim's warm task process (`warm.py`); the host's has none, so each shim starts without


def open_notify() -> None:
    """Take the wake-up socket the worker passed the shim host (non-blocking: a shim never waits on the worker)."""
    global _notify
    raw = os.environ.pop(NOTIFY_ENV, "")
    if raw.isdigit():
        with contextlib.suppress(OSError):
            _notify = socket.socket(fileno=int(raw))
            _notify.setblocking(False)
            os.set_inheritable(_notify.fileno(), False)  # no job's exec gets it


def base_env() -> dict[str, str]:
    """The shim host's environment (the worker's, which started it), less the worker's credentials, read once: the
    host reads it before its first fork, so every shim has it (os.environ decodes every key on each read)."""
    global _base_env
    if _base_env is None:
        _base_env = jobuser.without_credentials(os.environ)
        for name in set(os.environ) - set(_base_env):  # nor in a task's process, which inherits os.environ
            del os.environ[name]
    return _base_env


def job_env(req: ShimRequest) -> dict[str, str]:
    """A job's whole environment: `base_env` with the request's `env` set over it. The worker sends only what a job
    adds (its spec's `env`, its secrets, `PILOOP_*`), so the line it writes, and the host and the shim read, carries a
    few variables, not the worker's every one."""
    return {**base_env(), **req.env}


def notify(name: str) -> bool:
    """Tell the worker a job's exit record is written; a wake-up only, so it never fails. False when the worker that
    started this shim's host is gone (its end of the pair closed), so nothing of it will read the job's record."""
    if _notify is not None:
        try:
            _notify.send(name.encode())
        except (ConnectionRefusedError, BrokenPipeError):
            return False
        except OSError:  # a full buffer: the worker is there, and its tick finds the record
            pass
    return True


def run(req: ShimRequest) -> int:
    """Run the job `req` describes (see `ShimHost.run_job`) to its end, and write `exit.json`; the dir's lock is
    held until then (the worker reads a dir without a held lock and without a record as a shim gone)."""
    jd = JobDir(Path(req.dir))
    lock_fd = os.open(jd.lock_file, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return 1  # another shim already supervises this dir
        return _supervise(req, jd)
    finally:
        os.close(lock_fd)  # a shim that runs another job next must not hold this one's dir


def _supervise(req: ShimRequest, jd: JobDir) -> int:
    signal.signal(signal.SIGTERM, lambda *_: _terminated.set())
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    grant = req.cgroup
    cg = JobCgroup(Path(grant.path), grant.version) if grant is not None else None
    held_seconds = grant.held_seconds if grant is not None else None
    held = (
        HeldWatch(grant.limit_mb * 2**20, float(held_seconds))
        if cg is not None and grant is not None and grant.limit_mb and held_seconds
        else None
    )
    oom_before = cg.oom_kills() if cg is not None else 0  # the group may be a spare, its counters an earlier job's
    peak = cg.peak_watch() if cg is not None else None  # its peak reset, for the same reason
    started_wall, started = time.time(), clock.now()
    proc: subprocess.Popen[bytes] | None = None
    # a warm process runs the task: one that another user's job never ran in, and never one of its own
    hot = WARM if req.task and req.warm_max_tasks and req.user is None else None
    if hot is None:
        # another kind of job on this slot: its end kills and reaps every process under the shim, the warm one too,
        # so that one ends first (the next task forks a fresh one, ~1 ms) rather than die unseen
        WARM.retire()
    try:
        if (user := jobuser.JobUser.of(req.user)) is not None:
            jobuser.hand_over(jd.root, user)
        if hot is not None:
            pid = hot.start(req, cg)
        elif req.task:
            pid = warm.fork_fresh(req, jd, cg)
        else:
            proc = _spawn(req, jd, cg)  # held to the end: a Popen collected early reaps the job under our wait4
            pid = proc.pid
    except (OSError, subprocess.SubprocessError) as e:
        jd.write_exit(
            ExitRecord(
                exit_code=127, reason=f"cannot start {req.argv[0]!r}: {e}", started=started_wall, ended=time.time()
            )
        )
        if peak is not None:
            peak.close()
        _told(jd, cg)
        return 0
    jd.write_shim(ShimRecord(os.getpid(), pid, pid, started_wall, str(cg.path) if cg is not None else None))
    pidfd = hot.pidfd if hot is not None else warm.pidfd_of(pid)
    wake = [fd for fd in (pidfd, hot.sock.fileno() if hot is not None and hot.sock else None) if fd is not None]
    warm_code: int | None = None  # the task's status, from a warm process that ran it to its end and lives on
    stop_metrics = threading.Event()
    metrics_thread: threading.Thread | None = None
    metrics_every = float(req.metrics_seconds)
    metrics_at: float | None = started + METRICS_AFTER if metrics_every > 0 else None
    meter = Meter(os.getpid(), include_root=False)  # the shim is a subreaper: all it has is the job's
    why = StopReason.NONE
    kill_at: float | None = None
    killed = False
    # the first sample a little after the start: a job that ends sooner is measured by wait4's rusage alone, and
    # each sample walks every process of the machine (psutil finds children by reading all of /proc)
    next_sample = started + FIRST_SAMPLE
    timeout = req.timeout
    grace = float(req.kill_grace)
    while True:
        # wait first: a task is forked from this process, and until it ends each page this loop writes is copied
        # (~0.4 ms a task left alone to its end); so a short job is checked on only once it ended, a long one each tick
        if not wake:
            time.sleep(TICK)
        else:  # wake the moment the job exits (or a warm process says its task ended), not up to a tick later
            select.select(wake, [], [], TICK)
        if hot is not None and (warm_code := hot.result()) is not None:
            status, ru = 0, None
            break
        done, status, ru = os.wait4(pid, os.WNOHANG)
        if done:
            if hot is not None:
                hot.gone()
            break
        now = clock.now()
        if not why:
            deadline = jd.read_deadline()
            if deadline is not None and now > deadline + LATE:
                # woken past its deadline (the host was frozen or suspended): the lease may be handed on already,
                # so no grace, which would let the job run beside its next copy
                why = StopReason.FENCED
                jobtree.kill_now(pid, meter, cg)
                killed = True
            elif deadline is None or now > deadline:
                why = StopReason.FENCED
            elif (stop := jd.stop_reason()) is not None:
                why = stop
            elif timeout and now - started > float(timeout):
                why = StopReason.TIMEOUT
            elif _terminated.is_set():
                why = StopReason.SHIM_TERMINATED
            if why and not killed:
                jobtree.signal_tree(pid, meter, signal.SIGTERM)
                kill_at = now + grace
        elif not killed and kill_at is not None and now >= kill_at:
            jobtree.kill_now(pid, meter, cg)
            killed = True
        if metrics_at is not None and now >= metrics_at:
            metrics_at = None
            metrics_thread = threading.Thread(
                target=_metrics_loop, args=(jd, metrics_every, stop_metrics), name="metrics", daemon=True
            )
            metrics_thread.start()
        if now >= next_sample:
            meter.sample()
            next_sample = now + SAMPLE_EVERY
            if held is not None and cg is not None and not why and held.observe(now, cg.usage_bytes(), cg.refaults()):
                why = StopReason.MEMORY_HELD  # thrashing at its limit, which the kernel will not kill for
                jobtree.signal_tree(pid, meter, signal.SIGTERM)
                kill_at = now + grace
    if pidfd is not None and hot is None:
        os.close(pidfd)
    if proc is not None:
        # reaped by our wait4: so told, the Popen never waits for its pid again, which a later job of this shim
        # may have by then (a Popen collected unreaped is waited for by subprocess at the next one's start)
        proc.returncode = os.waitstatus_to_exitcode(status)
    # the job is its main process: whatever it left behind in its group (or cgroup) ends with it
    stop_metrics.set()
    if metrics_thread is not None:
        metrics_thread.join(5)  # its last sample in this job's dir, not the next one's time
    if warm_code is not None and hot is not None:
        cpu, rss = hot.usage()  # its own, this task's; before it leaves the task's cgroup (or retires)
        hot.between_tasks(cg)
        jobtree.reap_all(pid, 2.0, keep=hot.pid)  # what the task left behind, not the warm process
    else:
        cpu, rss = (ru.ru_utime + ru.ru_stime, ru.ru_maxrss * 1024) if ru is not None else (0.0, 0)
        jobtree.signal_tree(pid, meter, signal.SIGKILL)
    if cg is not None:
        cg.kill_all()
    if warm_code is None:
        jobtree.reap_all(pid, 2.0)
    oom, reason = False, ""
    if cg is not None:
        oom = cg.oom_kills() > oom_before or why is StopReason.MEMORY_HELD
        if why is StopReason.MEMORY_HELD:
            reason = f"out of memory (held at its limit for {held_seconds:g}s)"
        # the group stays: the worker gives it back for a later job, or removes it (`Cgroups.give`)
    exit_code = warm_code if warm_code is not None else os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
    # a warm process is the slot's, shared by its tasks: one killed from outside under a task (the OOM killer for
    # the whole host, an operator) is lost like a worker, and its task queued again, not failed for what it did
    lost = hot is not None and warm_code is None and not why and not oom and _killed_from_outside(status)
    if lost:
        reason = f"its warm task process was killed by {signal.Signals(os.WTERMSIG(status)).name} from outside"
    error: tuple[str, ...] = ()
    if req.task and not why and exit_code == tasks.FAILED:
        reason = reason or tasks.reason(jd)  # its module could not be imported: one line, the job's reason
        error = tasks.error_classes(jd)  # what it raised, for the server's retry_on
    # a warm process's own CPU before this task is not this task's: its sampled share is replaced by the task's
    usage = meter.usage(cpu, rss, without=pid if warm_code is not None else None)
    if peak is not None and (most := peak.peak_bytes()) is not None:  # the kernel's count over the sampled one
        usage = usage._replace(peak_rss_bytes=most)
    jd.write_exit(
        ExitRecord(
            exit_code=exit_code,
            signal=os.WTERMSIG(status) if warm_code is None and os.WIFSIGNALED(status) else None,
            oom=oom,
            stopped=why,
            lost=lost,
            reason=reason,
            usage=usage,
            duration_seconds=round(clock.now() - started, 3),
            error=error,
            started=started_wall,
            ended=time.time(),
        )
    )
    _told(jd, cg)
    return 0


def _killed_from_outside(status: int) -> bool:
    """Whether a process ended by a signal that only another process sends (a task's own fault is a SIGSEGV, an
    abort, an exit status)."""
    return os.WIFSIGNALED(status) and os.WTERMSIG(status) in (signal.SIGKILL, signal.SIGTERM)


def _told(jd: JobDir, cg: JobCgroup | None) -> None:
    """The worker told that the job's exit record is written: the word says the shim is idle now, or, once a SIGTERM
    came, that it ends (`ShimHost.ended`). The worker keeps the job's group for a later job (`Cgroups.give`); a worker
    gone cannot, so the shim removes it (one restarted that re-attaches the job finds it gone, as it would leave it)."""
    if not notify(jd.root.name + ("\0last" if _terminated.is_set() else "")) and cg is not None:
        cg.remove()


def _spawn(req: ShimRequest, jd: JobDir, cg: JobCgroup | None) -> subprocess.Popen[bytes]:
    """The job's process, in its own process group (and its cgroup from its first instruction); with a user in the
    request, as that user (set by subprocess in C between fork and exec) in a Landlock domain of its own."""
    user = jobuser.JobUser.of(req.user)
    as_user: dict[str, Any] = (
        {"user": user.uid, "group": user.gid, "extra_groups": list(user.groups)} if user is not None else {}
    )
    env = job_env(req)
    with open(jd.output_log, "ab") as log, cg.entered() if cg is not None else contextlib.nullcontext(False) as inside:
        argv = req.argv
        prepare: Callable[[], None] | None = _in_child(cg if cg is not None and not inside else None, user is not None)
        if user is None and (cg is None or inside) and (helper := spawning.setpriv_path()) is not None:
            # the parent-death signal set by setpriv before it execs the job, not by a `preexec_fn`: Python then
            # spawns with vfork, not a fork of the whole shim (bench: 0.8 ms a /bin/true job against 5.5, with the
            # job's exec 1.8; docs/worker.md)
            argv, prepare = (
                [helper, "--pdeathsig", "KILL", "--", spawning.found(req.argv[0], env, jd.work), *argv[1:]],
                None,
            )
        proc = subprocess.Popen(
            argv,
            cwd=jd.work,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            process_group=0,
            preexec_fn=prepare,
            **as_user,
        )
    return proc


def _in_child(cg: JobCgroup | None, isolate: bool) -> Callable[[], None]:
    """What the job's process does between fork and exec (after subprocess set its user, which would clear it): join
    its cgroup, enter its own Landlock domain, and die with its shim."""
    path = str(cg.join_path()) if cg is not None else ""
    shim_pid = os.getpid()

    def prepare() -> None:
        if path:
            with open(path, "w") as f:
                f.write(str(os.getpid()))
        if isolate:
            jobuser.isolate()
        die_with_parent(shim_pid, signal.SIGKILL)  # a job never outlives its supervisor

    return prepare


def _metrics_loop(jd: JobDir, every: float, stop: threading.Event) -> None:
    if every <= 0:
        return
    while not stop.is_set():
        with contextlib.suppress(Exception):
            metrics.append(jd.metrics, jd.root)
        stop.wait(every)


def main_forked(req: ShimRequest, channel: socket.socket | None = None) -> None:
    """The shim's life after the fork: its own session, then `req`'s job, each with its own log; then, with a
    `channel` to the worker, the next request waited for there, until the worker lets it go."""
    os.setsid()
    set_name("piloop-shim")
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    prctl(PR_SET_CHILD_SUBREAPER, 1)  # the job's orphans come to the shim (not init): it sees, kills and reaps them all
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    jobs = 0
    while True:
        _run_logged(req, devnull)
        jobs += 1
        if channel is None or jobs >= JOBS_PER_SHIM or _terminated.is_set():
            return
        next_req = _next_request(channel)
        if next_req is None:
            return
        req = next_req


def _run_logged(req: ShimRequest, devnull: int) -> None:
    """`run`, its output to the job's `shim.log`, its failure in the record, never a silent death; then the output
    back to /dev/null, so nothing an idle shim writes lands in a job's dir."""
    jd = JobDir(Path(req.dir))
    try:
        out = os.open(jd.shim_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(out)
        run(req)
    except BaseException as e:
        with contextlib.suppress(Exception):
            os.write(2, f"shim failed: {type(e).__name__}: {e}\n".encode())
            if not jd.exit_json.exists():
                now = time.time()
                jd.write_exit(ExitRecord(reason=f"the shim failed: {type(e).__name__}: {e}", started=now, ended=now))
        if not isinstance(e, Exception):
            raise  # SystemExit, KeyboardInterrupt: this shim ends here
    finally:
        with contextlib.suppress(OSError):
            sys.stdout.flush()
            sys.stderr.flush()
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)


def _next_request(channel: socket.socket) -> ShimRequest | None:
    """Wait for the worker's next request (its word from `notify` told it this shim is idle); None when the worker
    let this shim go or is gone."""
    # idle, a SIGTERM ends the shim (it holds no job); each job sets its own handler again
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        raw = channel.recv(MAX_REQUEST)
    except OSError:
        return None
    if not raw:
        return None
    try:
        return ShimRequest.parse(raw)
    except (ValueError, TypeError):
        return None


__all__ = ["main_forked", "run"]
