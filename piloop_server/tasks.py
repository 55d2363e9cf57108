"""The server's background work on rq: slow side work (platform calls, bundle builds, integrating commits) off the
daemon's pass, with retries.

`submit(rt, "module:function", *args, key=…)` enqueues `function(rt, *args)` on an rq queue in the server's Redis.
`piloop serve` runs one rq worker process per queue (`queues(rt)`: `default`, and `provisioner.<pool>` for each
pool with a provisioner), started when its queue first has a task, so a slow platform call delays only its own
pool's calls, never another pool's nor other background work. Each worker process builds its `Runtime` once, from the same home and settings as the server, and
dies with the server (`PR_SET_PDEATHSIG`); the server restarts one that dies.

rq's keys live under our hash tag: `RQ_KEY_PREFIX` is `keys.rq_prefix()` (`{<namespace>}:rq`), set before rq is
imported in a worker process; submitters use Job/Queue classes with the same prefix, so any process may submit.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from piloop_common import logformat
from piloop_common.errors import ConfigError
from piloop_common.prctl import PR_SET_PDEATHSIG, prctl
from piloop_server.logfiles import logs_dir, tasks_log
from piloop_server.state import taskqueue
from piloop_server.state.keys import Keys

if TYPE_CHECKING:
    from piloop_server.runtime import Runtime
    from piloop_server.state.connection import Client

log = logging.getLogger("piloop.tasks")

DEFAULT = "default"
BY = "service:tasks"
PREFIX_ENV = "RQ_KEY_PREFIX"  # rq reads it once, when it is first imported
# Retries after a failure, each after this many seconds. Tests shorten them with this env ("1,1").
RETRY_ENV = "PILOOP_TASK_RETRY_SECONDS"
RETRY_SECONDS = (5, 30, 120)
TIMEOUT_SECONDS = 600  # a task still running then is killed (rq's death penalty) and retried
FAILURE_TTL_SECONDS = 86_400  # how long rq keeps a task that failed its last retry, for inspection
RESTART_MAX_SECONDS = 60.0
# how often `Workers.watch` looks for queued tasks when nothing woke it: a submit in this process (the pass, the
# API) wakes it at once; one from another process (a task that submits to another queue) is seen within this
WATCH_SECONDS = 1.0
_submitted = threading.Event()

_rt: Runtime | None = None  # a worker process's Runtime, built once by main()


def provisioner_queue(pool: str) -> str:
    """The queue of one pool's platform calls: one worker each, so a slow platform delays only its own pool."""
    return f"provisioner.{pool}"


def queues(rt: Runtime) -> list[str]:
    """Every queue that `piloop serve` runs a worker for."""
    return [DEFAULT] + [provisioner_queue(n) for n, p in sorted(rt.executor.pools.items()) if p.provisioner]


def job_id(key: str) -> str:
    """rq allows only [A-Za-z0-9_-] in a job id: the key made so, and a digest of it so that two keys never meet."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", key)[:80] + "-" + hashlib.sha256(key.encode()).hexdigest()[:16]


def retry_seconds() -> list[int]:
    raw = os.environ.get(RETRY_ENV, "").strip()
    if not raw:
        return list(RETRY_SECONDS)
    try:
        got = [max(1, round(float(s))) for s in raw.split(",") if s.strip()]
    except ValueError:
        raise ConfigError(f"{RETRY_ENV}={raw!r}: give seconds separated by commas, such as 5,30,120") from None
    return got or list(RETRY_SECONDS)


def submit(rt: Runtime, func: str, *args: Any, key: str, queue: str = DEFAULT) -> bool:
    """Run `func` ("module:function", called as `function(rt, *args)`, args JSON-able) in a background worker.

    `key` names the work: while a task with that key is queued, running or waiting to be retried, another submit
    does nothing and answers False; once it has ended, a submit runs it again. A task that raises is retried
    after each of RETRY_SECONDS, then it is a `task.failed` event. A task may run more than once (a retry, a
    worker killed half-way), so functions must be idempotent.
    """
    from rq import Retry
    from rq.callbacks import Callback
    from rq.exceptions import DuplicateJobError

    if ":" not in func:
        raise ValueError(f"func {func!r}: name it module:function")
    q = rt.taskqueues.queue(queue)
    jid = job_id(key)
    intervals = retry_seconds()
    for _ in range(2):
        try:
            q.enqueue_call(
                "piloop_server.tasks._call",
                args=[func, key, list(args)],
                job_id=jid,
                unique=True,
                timeout=TIMEOUT_SECONDS,
                result_ttl=0,
                failure_ttl=FAILURE_TTL_SECONDS,
                retry=Retry(max=len(intervals), interval=intervals),
                on_failure=Callback("piloop_server.tasks._failed"),
                meta={"namespace": rt.keys.namespace},
                description=f"{func} key={key}",
            )
            _submitted.set()
            return True
        except DuplicateJobError:
            if not rt.taskqueues.clear_ended(jid):
                return False
    return False


# -- inside a worker process -------------------------------------------------------------------------


def _call(func: str, key: str, args: list[Any]) -> None:
    if _rt is None:
        raise RuntimeError("piloop tasks run only in the background workers that `piloop serve` starts")
    module, _, name = func.partition(":")
    fn = getattr(importlib.import_module(module), name)
    fn(_rt, *args)


def _failed(job: Any, connection: Client, exc_type: Any, exc_value: Any, _tb: Any) -> None:
    """rq's failure callback, for every failed run (also of a task whose worker died): the last one is an event."""
    func, key = (job.args or ["?", "?"])[:2]
    error = f"{getattr(exc_type, '__name__', exc_type)}: {exc_value}"
    if job.retries_left:
        log.warning("event=task.retrying func=%s key=%s retries_left=%d error=%s", func, key, job.retries_left, error)
        return
    from piloop_server.state.events import EventsState

    ns = (job.meta or {}).get("namespace") or (_rt.keys.namespace if _rt else "piloop")
    EventsState(connection, Keys(ns)).add("task.failed", BY, func=func, key=key, error=error[:2000])
    log.error("event=task.failed func=%s key=%s error=%s", func, key, error)


def _die_with(parent: int) -> None:
    """Exit when `parent` (piloop serve) dies, however it dies: SIGKILL from the kernel, else a watching thread."""
    ok = prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(0)  # it died before the prctl
    if not ok:

        def watch() -> None:
            while os.getppid() == parent:
                time.sleep(1.0)
            os._exit(0)

        threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _runtime(home: Path) -> Runtime:
    from piloop_common.cas import open_store
    from piloop_common.config.load import load_settings
    from piloop_server.runtime import Runtime
    from piloop_server.state.connection import connect
    from piloop_server.state.generation import stored_server_id

    settings = load_settings(home)
    client = connect(settings, home)
    store = open_store(settings.plugins.cas, home)
    rt = Runtime(settings=settings, home=home, redis=client, store=store, cas_id=store.identity())
    rt.server_id = stored_server_id(client, rt.keys) or rt.server_id  # the server wrote it before starting us
    return rt


def _rss_mb() -> float:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def main(argv: list[str] | None = None) -> int:
    """One background worker process: `--home H --queue Q [--queue …] --parent PID`."""
    global _rt
    started = time.monotonic()
    ap = argparse.ArgumentParser(prog="piloop-tasks")
    ap.add_argument("--home", required=True, type=Path)
    ap.add_argument("--queue", action="append", required=True)
    ap.add_argument("--parent", type=int, default=0)
    a = ap.parse_args(argv)
    if a.parent:
        _die_with(a.parent)
    logformat.setup("json" if os.environ.get(logformat.ENV) == "json" else "text")
    rt = _runtime(a.home)
    prefix = rt.keys.rq_prefix()
    os.environ[PREFIX_ENV] = prefix
    import rq.defaults

    if prefix != rq.defaults.RQ_KEY_PREFIX:
        raise ConfigError(f"rq was imported with the key prefix {rq.defaults.RQ_KEY_PREFIX!r}, not {prefix!r}")
    from rq import SimpleWorker
    from rq.serializers import JSONSerializer

    _rt = rt
    conn = taskqueue.rq_connection(rt.settings, a.home)
    taskqueue.reclaim(conn, a.queue)
    threading.Thread(target=taskqueue.schedule, args=(conn, a.queue, a.home), name="scheduler", daemon=True).start()
    worker = SimpleWorker(
        a.queue,
        connection=conn,
        serializer=JSONSerializer,
        name=f"{'+'.join(a.queue)}.{socket.gethostname()}.{os.getpid()}",
    )
    log.info(
        "event=tasks.ready queues=%s pid=%d seconds=%.2f rss_mb=%.0f",
        ",".join(a.queue),
        os.getpid(),
        time.monotonic() - started,
        _rss_mb(),
    )
    worker.work(logging_level="WARNING")
    return 0


# -- in piloop serve: the worker processes ---------------------------------------------------------


class Workers:
    """`piloop serve`'s background workers: one child process per queue, started when its queue first has a task
    (a server without campaigns or provisioned pools pays for none), then kept, and restarted when one dies."""

    def __init__(self, rt: Runtime, home: Path) -> None:
        self.rt, self.home, self.names = rt, home, queues(rt)
        self.env = {**os.environ, PREFIX_ENV: rt.keys.rq_prefix()}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.started: dict[str, float] = {}
        self.delay: dict[str, float] = {}
        self.stopping = False

    def _spawn(self, name: str) -> None:
        argv = [
            sys.executable,
            "-c",
            "import sys; from piloop_server.tasks import main; sys.exit(main())",
            "--home",
            str(self.home),
            "--queue",
            name,
            "--parent",
            str(os.getpid()),
        ]
        with open(logs_dir(self.home) / tasks_log(name), "ab") as out:
            p = subprocess.Popen(argv, env=self.env, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
        self.procs[name], self.started[name] = p, time.monotonic()
        log.info("event=tasks.worker_started queue=%s pid=%d", name, p.pid)

    def _wanted(self) -> list[str]:
        """The queues without a worker yet that have a task waiting."""
        idle = [n for n in self.names if n not in self.procs]
        if not idle:
            return []
        return self.rt.taskqueues.waiting(idle)

    def watch(self, stop: threading.Event) -> None:
        due: dict[str, float] = {}
        while not stop.is_set():
            # woken by a submit in this process, else once a WATCH_SECONDS: an idle server asked Redis 4 times a
            # second whether any queue had work, and a submitted task waited up to 0.25 s for its worker
            _submitted.wait(min([WATCH_SECONDS, *(max(0.0, t - time.monotonic()) for t in due.values())]))
            _submitted.clear()
            if self.stopping or stop.is_set():
                return
            try:
                for name in self._wanted():
                    self._spawn(name)
            except Exception as e:  # noqa: BLE001 (Redis away: the pass says so; look again next time)
                log.debug("event=tasks.watch_failed error=%s", e)
            now = time.monotonic()
            for name, p in list(self.procs.items()):
                if p.poll() is None:
                    continue
                if name not in due:
                    # doubling while it dies young, from 0.5 s: a crash loop never spins
                    lived = now - self.started[name]
                    d = 0.5 if lived > RESTART_MAX_SECONDS else min(self.delay.get(name, 0.25) * 2, RESTART_MAX_SECONDS)
                    self.delay[name], due[name] = d, now + d
                    log.warning("event=tasks.worker_exited queue=%s code=%s (restarting in %gs)", name, p.returncode, d)
                if now >= due[name]:
                    due.pop(name)
                    self._spawn(name)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL: rq's SimpleWorker ends at once, and a task it was running stays `started` until
        the next server's worker of its queue reclaims it (`_reclaim`) and runs it again."""
        self.stopping = True
        procs = list(self.procs.values())
        for p in procs:
            if p.poll() is None:
                p.terminate()
        end = time.monotonic() + timeout
        for p in procs:
            try:
                p.wait(max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
