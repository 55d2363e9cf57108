"""The Celery side of the benchmarks: the app and its tasks (the jobs themselves are in `bench.noop`).

The app is built from `PILOOP_BENCH_BROKER` (a Redis URL) and `PILOOP_BENCH_QUEUE` when this module is imported
by `celery -A bench.tasks worker`; a finished no-op counts itself in `<queue>:done` (one INCR), since the bench
runs Celery without a result backend. `PILOOP_BENCH_BACKEND` (a Redis URL) gives it one, results stored
(the retention soak, bench/soak.py, measures what they hold).
"""

from __future__ import annotations

import os

from bench import noop as jobs

BROKER = os.environ.get("PILOOP_BENCH_BROKER", "redis://127.0.0.1:6379/0")
QUEUE = os.environ.get("PILOOP_BENCH_QUEUE", "bench")
BACKEND = os.environ.get("PILOOP_BENCH_BACKEND") or None
# the recovery bench: the Redis transport's visibility_timeout (unset: kombu's default, 3600 s), and the unacked
# set's own keys (kombu's are one set for the whole Redis: a worker's restore sweep would hand on another side's)
VISIBILITY = os.environ.get("PILOOP_BENCH_VISIBILITY")
UNACKED = os.environ.get("PILOOP_BENCH_UNACKED")

try:
    from celery import Celery
except ImportError:  # rq's side needs no Celery
    app = None
else:
    app = Celery("bench", broker=BROKER, backend=BACKEND)
    app.conf.update(
        task_default_queue=QUEUE,
        task_ignore_result=BACKEND is None,
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
        worker_send_task_events=False,
    )
    if VISIBILITY:
        app.conf.broker_transport_options = {"visibility_timeout": float(VISIBILITY)}
    if UNACKED:
        app.conf.broker_transport_options = {
            **app.conf.broker_transport_options,
            **{f"{k}_key": UNACKED + k for k in ("unacked", "unacked_index", "unacked_mutex")},
        }
    _redis = None

    def _done() -> None:
        global _redis
        if _redis is None:
            import redis

            _redis = redis.Redis.from_url(BROKER)
        _redis.incr(f"{QUEUE}:done")

    @app.task(name="bench.noop")
    def celery_noop() -> None:
        jobs.noop()
        _done()

    @app.task(name="bench.true")
    def celery_true() -> None:
        jobs.run_true()
        _done()

    @app.task(name="bench.stamp")
    def celery_stamp(path: str) -> None:
        jobs.stamp(path)

    @app.task(name="bench.marked", acks_late=True, reject_on_worker_lost=True)
    def celery_marked(path: str, job: str, seconds: float) -> None:
        jobs.marked(path, job, seconds)
