"""The peers' sides of the jobs benchmarks: rq's and Celery's drains and start latency, on the bench's Redis.

rq: two `rq worker` (`rq_worker`), `Worker` forking a work horse per job, `SimpleWorker` running it in-process.
Celery (`celery_workers`): prefork, one `celery worker --concurrency 2`; solo, two `celery worker --pool solo`;
Redis broker, no result backend (a finished task INCRs a counter, so the bench knows when all are done), the tasks
sent through `celery_client`. A peer's "subprocess" task runs `/bin/true` with `subprocess.run`, its "Python" task
is a plain function call (`PY_JOB`, `CELERY_TASK`). bench/jobs.py and bench/__main__.py run these beside piloop's
side; bench/recovery.py, bench/depth.py and bench/peers_memory.py start their peers' workers and clients here.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from pathlib import Path

import psutil
import redis

# here, in the importing thread: celery resolves `Celery` lazily on first use, and the recovery part's sides start in
# threads of their own, where two first uses at once raised "cannot import name 'Celery'" (a CI run of 2026-12-07)
from celery import Celery

from bench.measure import (
    BIN,
    ROOT,
    CpuWatch,
    Drain,
    Latency,
    RssWatch,
    long_lived,
    rss_mib,
    say,
    stamp_time,
    stop_procs,
    wait_until,
)
from tests.helpers.redis import RedisProcess

# -- rq -------------------------------------------------------------------------------------

RQ_CLASSES = {"Worker": "rq.worker.Worker", "SimpleWorker": "rq.worker.SimpleWorker"}
PY_JOB = {"python": "noop", "subprocess": "run_true"}


def rq_worker(
    rp: RedisProcess, queue: str, cls: str, burst: bool, tmp: Path, session: bool = False
) -> subprocess.Popen:
    """An `rq worker`; with `session`, in a session of its own (killed with its work horse as one group)."""
    args = [str(BIN / "rq"), "worker", "--url", rp.url, "--quiet", "--worker-class", RQ_CLASSES[cls]]
    return subprocess.Popen(
        args + (["--burst"] if burst else []) + [queue],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=tmp,
        start_new_session=session,
    )


def rq_drain(rp: RedisProcess, n: int, cls: str, job: str, tmp: Path) -> Drain:
    from rq import Queue

    from bench import noop

    r = redis.Redis.from_url(rp.url)
    q = Queue("rq" + uuid.uuid4().hex[:8], connection=r)
    fn = getattr(noop, PY_JOB[job])
    for _ in range(n):
        q.enqueue(fn)
    t0 = time.perf_counter()
    procs = [rq_worker(rp, q.name, cls, True, tmp) for _ in range(2)]
    cpu = CpuWatch(
        {"workers": [p.pid for p in procs], "redis": [rp.proc.pid]},  # type: ignore[union-attr]
        reaped="workers",
    )
    last = cpu.start
    with RssWatch({f"w{i}": [p.pid] for i, p in enumerate(procs)}, children=False) as watch:  # not its horses

        def done() -> bool:
            nonlocal last
            if all(p.poll() is not None for p in procs):
                return True
            last = cpu._now()  # a burst worker's CPU can only be read while it lives
            # the last job's end, not the burst workers' exit, which at times lingers a minute past it
            return q.finished_job_registry.count + q.failed_job_registry.count >= n

        wait_until(done, 3600, "rq to drain", every=0.01, report=lambda: say(f"rq {cls} {job}: {n - len(q)} taken"))
        seconds = time.perf_counter() - t0
    stop_procs(procs)
    cpu_ms = {k: (last[k] - cpu.start[k]) * 1000 / n for k in last}
    bad = q.failed_job_registry.count
    d = Drain(n, seconds, bad, max(watch.peak.values()), cpu_ms=cpu_ms)
    say(f"rq {cls} {job}: {d.rate:.1f} jobs/s")
    r.close()
    return d


def rq_latency(rp: RedisProcess, k: int, gap: float, cls: str, tmp: Path) -> Latency:
    from rq import Queue

    from bench.noop import stamp

    r = redis.Redis.from_url(rp.url)
    q = Queue("rq" + uuid.uuid4().hex[:8], connection=r)
    procs = [rq_worker(rp, q.name, cls, False, tmp) for _ in range(2)]
    out = Latency()
    try:
        for i in range(-1, k):  # -1: the warm-up job, which waits for the workers to be up
            time.sleep(gap)
            mark = tmp / f"rq-{cls}-{i}-{uuid.uuid4().hex[:6]}"
            t = time.time()
            q.enqueue(stamp, str(mark))
            started = wait_until(lambda mark=mark: stamp_time(mark), 60, "an rq job to start", every=0.001)
            if i >= 0:
                out.samples.append(started - t)
        time.sleep(gap)
        out.worker_rss_mib = max(rss_mib([psutil.Process(p.pid)]) for p in procs)
        say(f"rq {cls}: start latency median {out.median_ms:.0f} ms, p99 {out.p99_ms:.0f} ms")
    finally:
        stop_procs(procs)
        r.close()
    return out


# -- Celery ---------------------------------------------------------------------------------

CELERY_TASK = {"python": "bench.noop", "subprocess": "bench.true"}


def celery_workers(
    rp: RedisProcess,
    queue: str,
    pool: str,
    tmp: Path,
    backend: str | None = None,
    env: dict[str, str] | None = None,
    count: int = 2,
    first: int = 0,
) -> list[subprocess.Popen]:
    """Celery workers of `bench.tasks` on `queue` (prefork: one of concurrency 2; solo: `count`, named from `first`
    on); with `backend` (a Redis URL), results stored there; `env`: more of bench/tasks.py's settings."""
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "PILOOP_BENCH_BROKER": rp.url,
        "PILOOP_BENCH_QUEUE": queue,
        **(env or {}),
    }
    if backend:
        env["PILOOP_BENCH_BACKEND"] = backend
    base = [
        str(BIN / "celery"),
        "-A",
        "bench.tasks",
        "worker",
        "--loglevel",
        "WARNING",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
    ]
    shapes = [["--pool", "prefork", "--concurrency", "2"]] if pool == "prefork" else [["--pool", "solo"]] * count
    return [
        subprocess.Popen(
            base + shape + ["-n", f"w{first + i}-{queue}@%h"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=tmp,
            start_new_session=True,
        )
        for i, shape in enumerate(shapes)
    ]


def celery_client(rp: RedisProcess, queue: str):
    app = Celery("bench-client", broker=rp.url)
    app.conf.update(task_default_queue=queue, task_ignore_result=True)
    return app


def celery_drain(rp: RedisProcess, n: int, pool: str, job: str, tmp: Path) -> Drain:
    queue = "cq" + uuid.uuid4().hex[:8]
    app = celery_client(rp, queue)
    with app.producer_or_acquire() as producer:
        for _ in range(n):
            app.send_task(CELERY_TASK[job], queue=queue, producer=producer)
    r = redis.Redis.from_url(rp.url)
    t0 = time.perf_counter()
    procs = celery_workers(rp, queue, pool, tmp)
    try:
        cpu = CpuWatch(
            {"workers": [p.pid for p in procs], "redis": [rp.proc.pid]},  # type: ignore[union-attr]
            reaped="workers",
        )
        with RssWatch({f"w{i}": [p.pid] for i, p in enumerate(procs)}) as watch:
            done = lambda: int(r.get(f"{queue}:done") or 0)  # noqa: E731
            wait_until(
                lambda: done() >= n,
                3600,
                "Celery to drain",
                every=0.01,
                report=lambda: say(f"celery {pool} {job}: {done()}/{n} done"),
            )
            seconds = time.perf_counter() - t0
            cpu_ms = cpu.per_job_ms(n)
    finally:
        stop_procs(procs, group=True)
        r.close()
        app.close()
    d = Drain(n, seconds, 0, max(watch.peak.values()), cpu_ms=cpu_ms)
    say(f"celery {pool} {job}: {d.rate:.1f} jobs/s")
    return d


def celery_latency(rp: RedisProcess, k: int, gap: float, pool: str, tmp: Path) -> Latency:
    queue = "cq" + uuid.uuid4().hex[:8]
    app = celery_client(rp, queue)
    procs = celery_workers(rp, queue, pool, tmp)
    out = Latency()
    try:
        with app.producer_or_acquire() as producer:
            for i in range(-1, k):  # -1: the warm-up job, which waits for the workers to be up
                time.sleep(gap)
                mark = tmp / f"celery-{pool}-{i}-{uuid.uuid4().hex[:6]}"
                t = time.time()
                app.send_task("bench.stamp", (str(mark),), queue=queue, producer=producer)
                started = wait_until(lambda mark=mark: stamp_time(mark), 60, "a Celery job to start", every=0.001)
                if i >= 0:
                    out.samples.append(started - t)
        time.sleep(gap)
        out.worker_rss_mib = max(rss_mib([psutil.Process(p) for p in long_lived(w.pid)]) for w in procs)
        say(f"celery {pool}: start latency median {out.median_ms:.0f} ms, p99 {out.p99_ms:.0f} ms")
    finally:
        stop_procs(procs, group=True)
        app.close()
    return out
