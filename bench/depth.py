"""Queue depth: what one claim costs, and what Redis holds, with 1k .. 1M evaluations queued; beside it the bytes a
queued job costs rq and Celery (Redis broker) for the same count.

piloop: a fresh namespace, `depth` evaluations queued through the state layer (`LeasesState.enqueue_many`, the enqueue
script in pipelines of 1,000: this measures the claim, not the submit), then `claims` single claims (`most=1`) by
one registered worker, each timed on its own; used_memory's delta over the depth is the bytes a queued job holds
(its hash, its place in the queue, its share of the events stream, which is capped at `events_max`). rq: the same
count through `Queue.enqueue_many` in one pipeline; Celery: `send_task` on one producer. Each side's keys are
deleted before the next depth, so each starts from the same used_memory.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from bench.claims import fresh
from bench.measure import quantile, say
from bench.peers import celery_client
from tests.helpers.redis import RedisProcess

BATCH = 1000
SPEC: dict[str, Any] = {"argv": ["true"]}


def _used(r: redis.Redis) -> int:
    return int(r.info("memory")["used_memory"])


def _drop(r: redis.Redis, match: str) -> None:
    """Delete the keys matching `match` (one side's, so the next depth starts from the same used_memory): DEL, not
    UNLINK, whose freeing in the background would lower a later measure's used_memory."""
    batch: list[bytes] = []
    for key in r.scan_iter(match=match, count=10_000):
        batch.append(key)
        if len(batch) >= 10_000:
            r.delete(*batch)
            batch = []
    if batch:
        r.delete(*batch)


def _drop_rq(r: redis.Redis, q: Any, ids: list[str]) -> None:
    """Delete an rq queue's keys and its jobs' (other queues' keys in the same run stay)."""
    from rq.job import Job

    for start in range(0, len(ids), 10_000):
        r.delete(*(Job.key_for(j) for j in ids[start : start + 10_000]))
    _drop(r, f"*{q.name}*")


def _bytes_per_job(r: redis.Redis, n: int, fill: Callable[[], None]) -> int:
    """Redis's bytes for each of the `n` jobs `fill` queues: the MEMORY USAGE of every key it made, not used_memory's
    growth, which whatever else Redis freed meanwhile (a closed client's buffers, an earlier part's keys) pulled
    below zero under load."""
    before = set(r.scan_iter(count=10_000))
    fill()
    made = [k for k in r.scan_iter(count=10_000) if k not in before]
    total = 0
    for start in range(0, len(made), 1000):
        pipe = r.pipeline(transaction=False)
        for k in made[start : start + 1000]:
            pipe.memory_usage(k, samples=0)
        total += sum(v or 0 for v in pipe.execute())
    return round(total / n)


def piloop_depth(r: redis.Redis, tmp: Path, depth: int, claims: int) -> dict[str, Any]:
    lz = fresh(r, tmp)
    lz.register("w", "bench", "", "cas", {}, protocol=1, by="worker:w")

    def fill() -> None:
        for start in range(0, depth, BATCH):
            ids = [(f"d{i}", SPEC) for i in range(start, min(depth, start + BATCH))]
            bad = [x for x in lz.enqueue_many(ids, "evaluation", "bench", by="human:bench") if not isinstance(x, int)]
            if bad:
                raise RuntimeError(f"enqueue refused: {bad[0]}")

    t = time.perf_counter()
    per_job = _bytes_per_job(r, depth, fill)
    filled = time.perf_counter() - t
    used = _used(r)
    samples = []
    for _ in range(claims):
        t = time.perf_counter()
        got = lz.claim("w", "bench", "evaluation", slots=claims, image="", most=1).leases
        samples.append(time.perf_counter() - t)
        if not got:
            raise RuntimeError(f"a claim with {depth} queued got nothing")
    _drop(r, lz.k.prefix() + "*")
    out: dict[str, Any] = {
        "depth": depth,
        "claims": claims,
        "used_memory": used,
        "bytes_per_queued_job": per_job,
        "enqueue_seconds": filled,
    }
    if samples:
        out["claim_p50_ms"] = quantile(samples, 0.5) * 1000
        out["claim_p99_ms"] = quantile(samples, 0.99) * 1000
    return out


def rq_depth(r: redis.Redis, depth: int, claims: int) -> dict[str, Any]:
    """rq's bytes a queued job at `depth`, and `claims` dequeues from that deep queue, each timed."""
    from rq import Queue

    from bench.noop import noop

    q = Queue("dq" + uuid.uuid4().hex[:8], connection=r)

    ids: list[str] = []

    def fill() -> None:
        for start in range(0, depth, BATCH):
            with r.pipeline() as pipe:
                datas = [Queue.prepare_data(noop) for _ in range(start, min(depth, start + BATCH))]
                ids.extend(j.id for j in q.enqueue_many(datas, pipeline=pipe))
                pipe.execute()

    per_job = _bytes_per_job(r, depth, fill)
    samples = []
    for _ in range(claims):
        t = time.perf_counter()
        got = Queue.dequeue_any([q], None, connection=r)
        samples.append(time.perf_counter() - t)
        if not got:
            raise RuntimeError(f"an rq dequeue with {depth} queued got nothing")
    _drop_rq(r, q, ids)
    out: dict[str, Any] = {"rq_bytes_per_queued_job": per_job}
    if samples:
        out["rq_dequeue_p50_ms"] = quantile(samples, 0.5) * 1000
        out["rq_dequeue_p99_ms"] = quantile(samples, 0.99) * 1000
    return out


def celery_bytes(rp: RedisProcess, r: redis.Redis, depth: int) -> int:
    queue = "dc" + uuid.uuid4().hex[:8]
    app = celery_client(rp, queue)

    def fill() -> None:
        # a connection of its own, closed before used_memory is read (its buffers would count in it)
        with app.connection_for_write() as conn, conn.Producer() as producer:
            for _ in range(depth):
                app.send_task("bench.noop", queue=queue, producer=producer)

    try:
        per_job = _bytes_per_job(r, depth, fill)
    finally:
        app.close()
    r.delete(queue, "_kombu.binding." + queue)
    return per_job


def run(rp: RedisProcess, tmp: Path, depths: list[int], claims: int, peers_upto: int) -> dict[str, Any]:
    """Each depth's piloop figures, and rq's and Celery's bytes a queued job up to `peers_upto` jobs."""
    r = redis.Redis.from_url(rp.url)
    out: dict[str, Any] = {"depths": []}
    try:
        for depth in depths:
            say(f"depth: {depth:,} queued evaluations")
            one = piloop_depth(r, tmp, depth, claims)
            if depth <= peers_upto:
                one |= rq_depth(r, depth, claims)
                one["celery_bytes_per_queued_job"] = celery_bytes(rp, r, depth)
            say(
                f"depth: {depth:,}: claim p50 {one['claim_p50_ms']:.2f} ms, p99 {one['claim_p99_ms']:.2f} ms, "
                f"{one['bytes_per_queued_job']} B a queued job (rq {one.get('rq_bytes_per_queued_job', '-')}, "
                f"Celery {one.get('celery_bytes_per_queued_job', '-')})"
            )
            out["depths"].append(one)
    finally:
        r.close()
    return out


def rows(d: dict[str, Any], row: Callable[..., None]) -> None:
    """The table's rows: a claim's p50 and p99 beside rq's dequeue from as deep a queue, and the bytes a queued job
    beside rq's and Celery's (queued bytes do not depend on the worker: they stand in the rq Worker and Celery
    prefork columns)."""
    last = d["depths"][-1]["depth"]
    for one in d["depths"]:
        n = one["depth"]
        for q in ("p50", "p99"):
            rq = one.get(f"rq_dequeue_{q}_ms")
            row(
                f"claim one of {n:,} queued: {q} of {one['claims']}",
                "ms",
                "lower",
                one[f"claim_{q}_ms"],
                other=("rq dequeue", rq) if rq is not None else None,
                note="rq: Queue.dequeue_any straight from Redis, no server, no lease"
                if q == "p50" and n == last
                else "",
            )
        row(
            f"  Redis bytes a queued job, {n:,} queued",
            "B",
            "lower",
            one["bytes_per_queued_job"],
            {"rq Worker": one.get("rq_bytes_per_queued_job"), "Celery prefork": one.get("celery_bytes_per_queued_job")},
            note=f"piloop: used_memory {one['used_memory'] / 2**20:.0f} MiB with them queued; rq, Celery: enqueued "
            "only, whatever the worker"
            if n == last
            else "",
        )
