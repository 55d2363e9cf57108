"""What a finished no-op job costs in Redis in rq and in Celery (Redis result backend), beside piloop's soak.

Each side's `n` jobs run to their end on the redis-server the soak used (its namespace idle by then), each under
a queue name of its own; the cost is used_memory's delta from before the first enqueue to after the last worker
left, over `n`. The workers start as `bench/peers.py` starts them; each side keeps its own defaults: rq a job's hash
and result for `result_ttl` (500 s), Celery a result for `result_expires` (1 day).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path

import redis

from bench.measure import say, stop_procs, wait_until
from bench.peers import celery_client, celery_workers, rq_worker
from tests.helpers.redis import RedisProcess


@dataclass
class PeerCost:
    jobs: int
    bytes_per_job: int
    keys_per_job: float
    ttl_seconds: int  # what is left of one finished job's keys' time to live when measured
    note: str


def _memory(r: redis.Redis) -> tuple[int, int]:
    """used_memory and DBSIZE once `r` is Redis's only client (a worker's buffers count in used_memory)."""
    wait_until(lambda: int(r.info("clients")["connected_clients"]) <= 1, 30, "the other clients to leave", every=0.05)
    return int(r.info("memory")["used_memory"]), int(r.dbsize())


def rq_cost(rp: RedisProcess, n: int, tmp: Path) -> PeerCost:
    """`n` no-op rq jobs through one `rq worker --burst` (SimpleWorker: no work horse), rq's default result_ttl."""
    from rq import Queue
    from rq.job import Job
    from rq.results import Result

    from bench.noop import noop

    r = redis.Redis.from_url(rp.url)
    used0, keys0 = _memory(r)
    q = Queue("soak" + uuid.uuid4().hex[:8], connection=r)
    ids = [q.enqueue(noop).id for _ in range(n)]
    proc = rq_worker(rp, q.name, "SimpleWorker", True, tmp)
    try:
        # the last job's end, not the burst worker's exit, which at times lingers a minute past it
        ended = lambda: q.finished_job_registry.count + q.failed_job_registry.count >= n  # noqa: E731
        wait_until(lambda: proc.poll() is not None or ended(), 3600, "rq's burst worker to finish", every=0.1)
    finally:
        stop_procs([proc])
    finished = q.finished_job_registry.count
    if finished != n:
        raise RuntimeError(f"rq finished {finished} of {n} jobs ({q.failed_job_registry.count} failed)")
    used, keys = _memory(r)
    ttl = int(r.ttl(Job.key_for(ids[-1])))
    result_ttl = int(r.ttl(Result.get_key(ids[-1])))
    r.close()
    cost = PeerCost(
        n,
        round((used - used0) / n),
        round((keys - keys0) / n, 2),
        ttl,
        f"rq keeps a finished job's hash ({ttl} s left) and its result stream ({result_ttl} s left), and its id in "
        "the queue's finished registry, for result_ttl (500 s by default)",
    )
    say(f"rq: {cost.bytes_per_job} B a finished job, {cost.keys_per_job} keys")
    return cost


def celery_cost(rp: RedisProcess, n: int, tmp: Path) -> PeerCost:
    """`n` no-op Celery tasks through `--pool solo` workers storing their results in Redis (result_expires: 1 day)."""
    from celery.backends.base import KeyValueStoreBackend

    queue = "soak" + uuid.uuid4().hex[:8]
    r = redis.Redis.from_url(rp.url)
    used0, keys0 = _memory(r)
    app = celery_client(rp, queue)  # no backend on the sending side: no result subscription per task
    with app.producer_or_acquire() as producer:
        ids = [app.send_task("bench.noop", queue=queue, producer=producer).id for _ in range(n)]
    app.pool.force_close_all()  # its connections' buffers would count in used_memory
    procs = celery_workers(rp, queue, "solo", tmp, backend=rp.url)
    try:
        done = lambda: int(r.get(f"{queue}:done") or 0)  # noqa: E731
        wait_until(lambda: done() >= n, 3600, "Celery to finish", every=0.1)
        meta = KeyValueStoreBackend.task_keyprefix + ids[-1]
        wait_until(lambda: r.exists(meta), 30, "Celery's last result", every=0.05)  # stored after the task's INCR
    finally:
        stop_procs(procs, group=True)
    used, keys = _memory(r)
    ttl = int(r.ttl(meta))
    r.close()
    cost = PeerCost(
        n,
        round((used - used0) / n),
        round((keys - keys0) / n, 2),
        ttl,
        f"Celery keeps each result under {KeyValueStoreBackend.task_keyprefix}<id> ({ttl} s left), for "
        "result_expires (1 day by default)",
    )
    say(f"celery: {cost.bytes_per_job} B a finished job, {cost.keys_per_job} keys")
    return cost
