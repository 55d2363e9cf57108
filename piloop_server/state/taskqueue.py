"""rq on the state Redis: its Job and Queue classes under our key prefix, rq's own connection, and the reads and
repairs of rq's keys that piloop_server/tasks.py needs (a submit made again after its task ended, tasks whose
worker died, the retry scheduler, the queue lengths)."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import socket
import time
from pathlib import Path
from typing import Any

import redis

from piloop_common.config.settings import Settings
from piloop_server.state.connection import Client, open_client
from piloop_server.state.records.codec import text as _s

log = logging.getLogger("piloop.tasks")

ENDED = (b"finished", b"failed", b"stopped", b"canceled")


@functools.cache
def classes(prefix: str) -> tuple[Any, Any]:
    """rq's Job and Queue with our prefix: right whatever prefix rq was imported with in this process."""
    from rq.job import Job
    from rq.queue import Queue

    job = type("PiloopJob", (Job,), {"redis_job_namespace_prefix": prefix + ":job:"})
    queue = type(
        "PiloopQueue",
        (Queue,),
        {"redis_queue_namespace_prefix": prefix + ":queue:", "redis_queues_keys": prefix + ":queues", "job_class": job},
    )
    return job, queue


class TaskQueues:
    """The server's rq queues on its Redis client, for submitting (any process may)."""

    def __init__(self, client: Client, prefix: str) -> None:
        self.r = client
        self.prefix = prefix
        self._queues: dict[str, Any] = {}  # kept: a Queue asks the server's version (INFO) once

    def queue(self, name: str) -> Any:
        from rq.serializers import JSONSerializer

        q = self._queues.get(name)
        if q is None:
            job_cls, queue_cls = classes(self.prefix)
            q = self._queues[name] = queue_cls(name, connection=self.r, job_class=job_cls, serializer=JSONSerializer)
        return q

    def clear_ended(self, job_id: str) -> bool:
        """Forget a task that has ended (failed, stopped) so its key can run again; False while it is live."""
        job_key = classes(self.prefix)[0].key_for(job_id)
        with self.r.pipeline(transaction=True) as pipe:
            try:
                pipe.watch(job_key)
                status = pipe.hget(job_key, "status")
                if status is not None and status not in ENDED:
                    return False
                pipe.multi()
                pipe.delete(job_key)
                pipe.execute()
                return True
            except redis.WatchError:
                return False  # another submit got there first

    def waiting(self, names: list[str]) -> list[str]:
        """The queues of `names` that have a task waiting."""
        if not names:
            return []
        queue_cls = classes(self.prefix)[1]
        pipe = self.r.pipeline(transaction=False)
        for n in names:
            pipe.llen(queue_cls.redis_queue_namespace_prefix + n)
        return [n for n, count in zip(names, pipe.execute(), strict=True) if count]


def rq_connection(settings: Settings, home: Path) -> Client:
    """rq's own client, on the same Redis as the server's (Sentinel, TLS and credentials alike): rq lengthens its
    socket timeout for the blocking pop, which the Runtime's must not get."""
    return open_client(settings, home, socket_connect_timeout=5)


def _worker_alive(conn: Client, name: str) -> bool:
    from rq.worker import Worker

    h = conn.hgetall(Worker.redis_worker_namespace_prefix + name) if name else {}
    if not h or b"death" in h:
        return False
    if _s(h.get(b"hostname")) != socket.gethostname():
        return True
    with contextlib.suppress(ValueError):
        pid = int(h.get(b"pid", b"0"))
        if pid == os.getpid():
            return False
        with contextlib.suppress(OSError):
            os.kill(pid, 0)
            return True
    return False


def reclaim(conn: Client, names: list[str]) -> None:
    """Tasks left running by a worker that died: retried now (or failed, with their event), not after rq's
    expiry, which would hold their keys for the task timeout and more."""
    from rq.executions import Execution
    from rq.registry import StartedJobRegistry
    from rq.serializers import JSONSerializer

    for name in names:
        reg = StartedJobRegistry(name, connection=conn, serializer=JSONSerializer)
        dead = []
        for jid, eid in reg.get_job_and_execution_ids(cleanup=False):
            try:
                worker = Execution.fetch(eid, jid, conn).worker_name
            except ValueError:
                worker = ""
            if not _worker_alive(conn, worker):
                dead.append(f"{jid}:{eid}")
        if dead:
            log.warning("event=tasks.reclaimed queue=%s tasks=%d (their worker died)", name, len(dead))
            conn.zadd(reg.key, dict.fromkeys(dead, 0), xx=True)
            reg.cleanup(timestamp=1)  # rq's own handling of abandoned tasks: retry, or fail with the callback


def schedule(conn: Client, names: list[str], home: Path) -> None:
    """Moves tasks whose retry delay has passed back to their queue (rq's scheduler, in a thread of this process
    rather than rq's forked one, which would outlive the server). Named per host and home, so a restarted worker
    takes its lock back at once."""
    from rq.scheduler import RQScheduler
    from rq.serializers import JSONSerializer

    name = "piloop-" + hashlib.sha256(f"{socket.gethostname()}:{home}:{names}".encode()).hexdigest()[:16]
    sched = RQScheduler(names, connection=conn, interval=1, serializer=JSONSerializer, name=name)
    failing = False
    while True:
        try:
            sched.acquire_locks()
            if sched.acquired_locks:
                sched.enqueue_scheduled_jobs()
            failing = False
        except Exception as e:  # noqa: BLE001 (Redis away, or rq's own error: this thread must live on; next second)
            if not failing:
                log.warning("event=tasks.scheduler_failed error=%s", e)
            failing = True
        time.sleep(1.0)
