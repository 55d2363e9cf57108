"""Recovery: a worker SIGKILLed mid-job; seconds until the job runs again on another worker, and whether the two
copies of it overlapped.

Each side: worker A takes a job whose first run goes on until it is killed (later runs last a second); once it has
started, worker B starts, and once B is up A is SIGKILLed with its process group (piloop: the worker and its shim
host; the shim, in its own session, fences its job by itself; rq: with its work horse, in a group of its own). The job appends `start`/`tick`/`end` lines to a
marker file (tests/helpers/workers.py's format, read by its `marker_runs`), so the figure is the second run's start
less the kill's time, and an overlap is the second run starting before the first's last line. The sides run at the
same time, on the same redis-server, each bounded by the run's limit:
  piloop          its defaults (toleration_seconds 300) and short timings (tests/helpers/serve.py's FAST_EXECUTOR:
                  renew 0.5 s, toleration 6 s; the demo runs on the defaults)
  rq              `rq worker` (Worker): the job stays in StartedJobRegistry; rq never runs it again by itself: its
                  maintenance (every 600 s) moves it to FailedJobRegistry once its heartbeat's TTL (90 s) lapsed
  Celery          `--pool solo`, the task `acks_late=True`, `reject_on_worker_lost=True`; the message waits in the
                  Redis transport's `unacked` set until `visibility_timeout` has passed and a live worker's restore
                  sweep puts it back: at the default (3600 s) and set to piloop's toleration
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import kombu.pools
import redis

from bench.jobs import PiloopSide
from bench.measure import say, stop_procs, wait_until
from bench.peers import celery_client, celery_workers, rq_worker
from tests.helpers.redis import RedisProcess
from tests.helpers.serve import FAST_EXECUTOR
from tests.helpers.workers import MARKER_JOB, marker_runs, overlapping

DEFAULT_TOLERATION = 300.0
SHORT_TOLERATION = 6.0
SHORT = FAST_EXECUTOR.split("[plugins.executor.pools")[0]  # its timings, without its pools


@dataclass
class Recovery:
    side: str
    again_seconds: float | None  # from the kill to the second run's start; None: it did not run again
    overlapped: bool | None
    note: str


def _outcome(side: str, marker: Path, job: str, killed: float, limit: float, never: Callable[[], str]) -> Recovery:
    """Wait (up to `limit` s after the kill) for the job's second run; then its figures, or `never()`'s words."""
    second = lambda: len(marker_runs(marker).get(job, [])) >= 2  # noqa: E731
    end = killed + limit
    while time.time() < end and not second():
        time.sleep(0.1)
    if not second():
        return Recovery(side, None, None, never())
    time.sleep(0.5)  # a first run still going would write a tick meanwhile
    runs = marker_runs(marker)[job]
    again = runs[1]["start"] - killed
    say(f"recovery: {side}: ran again {again:.1f} s after the kill, overlapped: {overlapping(runs)}")
    return Recovery(side, again, overlapping(runs), "")


def _started(marker: Path, job: str) -> bool:
    return bool(marker_runs(marker).get(job))


def _killpg(proc: subprocess.Popen) -> float:
    t = time.time()
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)
    return t


def piloop_side(rp: RedisProcess, tmp: Path, label: str, executor: str, limit: float) -> Recovery:
    side = PiloopSide(rp, slots=2, executor=executor).start()
    marker = tmp / f"recovery-{uuid.uuid4().hex[:6]}"
    procs: list[subprocess.Popen] = []
    try:
        with side.api() as api:
            env = {"MARKER": str(marker), "RUN_SECONDS": "1", "FIRST_FOREVER": "1"}
            spec = {"argv": [sys.executable, "-c", MARKER_JOB], "env": env}
            job = api.call("POST", "/v1/jobs", {"pool": "bench", "spec": spec})["job"]
            procs += side.spawn_workers(1)
            wait_until(lambda: _started(marker, job), 120, f"piloop ({label}): the job to start")
            procs += side.spawn_workers(1)
            wait_until(lambda: len(api.call("GET", "/v1/workers")) >= 2, 120, f"piloop ({label}): worker B")
        killed = _killpg(procs[0])
        say(f"recovery: {label}: worker A killed")
        return _outcome(label, marker, job, killed, limit, lambda: f"> the run's limit ({limit:.0f} s)")
    finally:
        stop_procs(procs, group=True)
        side.close()


def rq_side(rp: RedisProcess, tmp: Path, limit: float) -> Recovery:
    from rq import Queue, Worker

    from bench.noop import marked

    r = redis.Redis.from_url(rp.url)
    q = Queue("rr" + uuid.uuid4().hex[:8], connection=r)
    marker, job = tmp / f"recovery-rq-{uuid.uuid4().hex[:6]}", "rqjob"
    procs = [rq_worker(rp, q.name, "Worker", False, tmp, session=True)]
    try:
        rq_job = q.enqueue(marked, str(marker), job, 1.0)
        wait_until(lambda: _started(marker, job), 120, "rq: the job to start")
        procs.append(rq_worker(rp, q.name, "Worker", False, tmp, session=True))
        wait_until(lambda: Worker.count(queue=q) >= 2, 60, "rq: worker B")
        killed = _killpg(procs[0])
        # its work horse runs the job in a process group of its own (rq's setpgrp): killed with it, as a lost
        # machine would; left alone, it would go on running the job, unfenced, its result reported when it ends
        os.killpg(marker_runs(marker)[job][0]["pgid"], signal.SIGKILL)
        say("recovery: rq: worker A killed, with its work horse")

        def never() -> str:
            where = "FailedJobRegistry" if rq_job.id in q.failed_job_registry.get_job_ids() else "StartedJobRegistry"
            return (
                f"never: in {where} after {time.time() - killed:.0f} s (rq's maintenance, every 600 s, moves a "
                "job 90 s past its last heartbeat to FailedJobRegistry; no retry unless the job has a Retry)"
            )

        return _outcome("rq Worker", marker, job, killed, limit, never)
    finally:
        stop_procs(procs, group=True)
        for run_ in marker_runs(marker).get(job, []):  # a second run's horse, if one started
            try:
                os.killpg(run_["pgid"], signal.SIGKILL)
            except ProcessLookupError:
                pass
        r.close()


def celery_side(rp: RedisProcess, tmp: Path, visibility: float | None, limit: float) -> Recovery:
    label = f"Celery, visibility_timeout {visibility or 3600:.0f} s" + ("" if visibility else " (default)")
    queue = "cr" + uuid.uuid4().hex[:8]
    extra = {"PILOOP_BENCH_UNACKED": queue + ":"}  # this side's own unacked set (see bench/tasks.py)
    if visibility:
        extra["PILOOP_BENCH_VISIBILITY"] = str(visibility)
    app = celery_client(rp, queue)
    marker, job = tmp / f"recovery-celery-{uuid.uuid4().hex[:6]}", "celeryjob"
    procs: list[subprocess.Popen] = []
    # one connection for the sending and the pings, closed with its channels at the end (their Redis clients
    # would count in a later part's used_memory, and it waits for Redis to have one client)
    conn = app.connection_for_write()
    try:
        procs += celery_workers(rp, queue, "solo", tmp, env=extra, count=1)
        with conn.Producer() as producer:
            app.send_task("bench.marked", (str(marker), job, 1.0), queue=queue, producer=producer)
        wait_until(lambda: _started(marker, job), 120, f"{label}: the task to start")
        procs += celery_workers(rp, queue, "solo", tmp, env=extra, count=1, first=1)
        b = f"w1-{queue}@{socket.gethostname()}"  # worker A, busy with the task in its solo pool, cannot answer
        wait_until(lambda: _pings(app, conn, b), 120, f"{label}: worker B", every=0.5)
        killed = _killpg(procs[0])
        say(f"recovery: {label}: worker A killed")
        return _outcome(
            label,
            marker,
            job,
            killed,
            limit,
            lambda: f"> the run's limit ({limit:.0f} s; visibility_timeout {visibility or 3600:.0f} s)",
        )
    finally:
        stop_procs(procs, group=True)
        conn.release()
        app.close()
        # the pings' broadcasts went out through kombu's pools, shared by every app of one broker URL: closed and
        # forgotten, so the next app opens its own
        kombu.pools.reset()


def _pings(app: Any, conn: Any, worker: str) -> bool:
    try:
        return any(worker in r for r in app.control.ping([worker], timeout=1, connection=conn) or [])
    except Exception:  # the broker's answer not there yet
        return False


def run(rp: RedisProcess, tmp: Path, limit: float, defaults: bool) -> dict[str, Any]:
    """Every side at once (their waits are timeouts, not work), each bounded by `limit` s after its kill; with
    `defaults`, piloop at its default timings and Celery with visibility_timeout at piloop's default toleration too
    (a full run: some 6 minutes)."""
    sides: dict[str, Callable[[], Recovery]] = {
        "piloop short": lambda: piloop_side(rp, tmp, "piloop, short timings", SHORT, limit),
        "rq": lambda: rq_side(rp, tmp, limit),
        "celery default": lambda: celery_side(rp, tmp, None, limit),
        "celery short": lambda: celery_side(rp, tmp, SHORT_TOLERATION, limit),
    }
    if defaults:
        sides["piloop defaults"] = lambda: piloop_side(rp, tmp, "piloop, defaults", "", limit)
        sides["celery defaults"] = lambda: celery_side(rp, tmp, DEFAULT_TOLERATION, limit)
    with ThreadPoolExecutor(len(sides)) as ex:
        futures = {k: ex.submit(f) for k, f in sides.items()}
        out = {k: asdict(f.result()) for k, f in futures.items()}
    return {"limit_seconds": limit, "sides": out}


def rows(d: dict[str, Any], row: Callable[..., None]) -> None:
    s = d["sides"]

    def show(r: dict[str, Any]) -> str:
        if r["again_seconds"] is None:
            return f"{r['side']}: {r['note']}"
        return f"{r['side']}: {r['again_seconds']:.1f} s, " + ("overlapped" if r["overlapped"] else "no overlap")

    pairs = [("piloop short", "celery short", SHORT_TOLERATION)]
    if "piloop defaults" in s:
        pairs.insert(0, ("piloop defaults", "celery defaults", DEFAULT_TOLERATION))
    for mine, theirs, tol in pairs:
        p, c = s[mine], s[theirs]
        row(
            f"recovery, worker SIGKILLed: s until the job runs again, {p['side'].split(', ')[1]} (toleration {tol:g} s)",
            "s",
            "lower",
            p["again_seconds"],
            other=(f"Celery vt={tol:g}", c["again_seconds"]) if c["again_seconds"] is not None else None,
            note="; ".join(show(x) for x in (p, c)),
        )
    row(
        "  recovery: rq, Celery at its default visibility_timeout",
        "s",
        "lower",
        None,
        note="; ".join(show(s[k]) for k in ("rq", "celery default")),
    )
