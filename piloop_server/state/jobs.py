"""Reading jobs: their hashes as `Job` records, their log and progress lists, the listing and the queue counts
(every write to a job is a script's: state/leases.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from piloop_server.state.connection import Client
from piloop_server.state.keys import Keys
from piloop_server.state.records.codec import text as _s
from piloop_server.state.records.job import FIELDS, Job, queued_at


@dataclass(frozen=True)
class JobWithLog:
    job: Job
    log: list[str] = field(default_factory=list)  # the chunks appended while it ran
    progress: list[str] = field(default_factory=list)  # its own notes (JSON), through the relay


class JobsState:
    def __init__(self, client: Client, keys: Keys) -> None:
        self.r = client
        self.k = keys

    def get(self, job_id: str) -> Job | None:
        return Job.from_hash(self.r.hgetall(self.k.job(job_id)))

    def get_many(self, ids: list[str]) -> list[Job | None]:
        """The records of `ids`, in order (None for one that is gone), in one round trip."""
        if not ids:
            return []
        pipe = self.r.pipeline(transaction=False)
        for j in ids:
            pipe.hgetall(self.k.job(j))
        return [Job.from_hash(h) for h in pipe.execute()]

    def field_of(self, ids: list[str], attr: str) -> list[str]:
        """One field (by its `Job` attribute) of each of `ids`, in order ('' where unset): a cheap read of many."""
        if not ids:
            return []
        pipe = self.r.pipeline(transaction=False)
        for j in ids:
            pipe.hget(self.k.job(j), FIELDS[attr])
        return [_s(v) for v in pipe.execute()]

    def with_log(self, job_id: str) -> JobWithLog | None:
        pipe = self.r.pipeline(transaction=False)
        pipe.hgetall(self.k.job(job_id))
        pipe.lrange(self.k.job_log(job_id), 0, -1)
        pipe.lrange(self.k.job_progress(job_id), 0, -1)
        h, log, notes = pipe.execute()
        job = Job.from_hash(h)
        if job is None:
            return None
        return JobWithLog(job, [_s(c) for c in log], [_s(n) for n in notes])

    def newest(self, n: int) -> list[str]:
        """The ids of the `n` newest jobs, newest first."""
        return [_s(x) for x in self.r.zrevrange(self.k.jobs(), 0, max(n, 1) - 1)]

    def set_campaign_error(self, job_id: str, why: str) -> None:
        self.r.hset(self.k.job(job_id), FIELDS["campaign_error"], why)

    def counts(self, pools: list[str], kinds: tuple[str, ...]) -> dict[tuple[str, str], tuple[int, int]]:
        """Per (pool, kind): how many jobs are queued and how many hold a lease."""
        pipe = self.r.pipeline(transaction=False)
        for pool in pools:
            for kind in kinds:
                pipe.zcard(self.k.queue(pool, kind))
                pipe.scard(self.k.active(pool, kind))
        got = iter(pipe.execute())
        return {(pool, kind): (int(next(got)), int(next(got))) for pool in pools for kind in kinds}

    def queues(self, pools: list[str], kinds: tuple[str, ...]) -> dict[tuple[str, str], QueueView]:
        """Per (pool, kind): the queue's depth and its first in line's score, and the leased jobs by state (two
        round trips; the second reads one field of each job holding a lease, so it is bounded by the slots)."""
        pipe = self.r.pipeline(transaction=False)
        for pool in pools:
            for kind in kinds:
                pipe.zcard(self.k.queue(pool, kind))
                pipe.zrange(self.k.queue(pool, kind), 0, 0, withscores=True)
                pipe.smembers(self.k.active(pool, kind))
        got = iter(pipe.execute())
        heads: dict[tuple[str, str], tuple[int, int | None, list[str]]] = {}
        for pool in pools:
            for kind in kinds:
                depth, first, active = int(next(got)), next(got), sorted(_s(j) for j in next(got))
                heads[(pool, kind)] = (depth, queued_at(first[0][1]) if first else None, active)
        states = iter(self.field_of([j for _, _, ids in heads.values() for j in ids], "state"))
        out = {}
        for key, (depth, oldest, ids) in heads.items():
            held = [next(states) for _ in ids]
            out[key] = QueueView(depth, oldest, held.count("leased"), len(held) - held.count("leased"))
        return out


@dataclass(frozen=True)
class QueueView:
    """One (pool, kind)'s queue and leases, for the metrics."""

    queued: int
    oldest_ms: int | None  # when the first in line was first queued (ms, Redis's clock; its score less its priority)
    leased: int
    running: int  # holding a lease and started (or gone from its hash since the read: counted here)
