"""Heartbeats at the production period: 1,000 and 10,000 simulated workers each beating every `renew_seconds`
(10 s by default), the CPU `piloop serve` and Redis spend on it, beside rq's workers beating as often straight to
Redis (rq's liveness: `Worker.heartbeat()`, Redis's CPU the only cost).

piloop: `claims.server_load(full=False)`: the simulated workers (tests/helpers/simworker.py) registered over HTTP,
then their heartbeats sent evenly at `workers / 10` a second from 8 threads for `seconds`. One client process on
this 2-CPU box shares the cores with the server and Redis: where it cannot send at the target rate, the figure is
the rate it drove (`driven`), and the table says so.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import redis

from bench import claims
from bench.measure import say
from tests.helpers.redis import RedisProcess

THREADS = 8


def rq_paced(rp: RedisProcess, workers: int, seconds: float) -> dict[str, Any]:
    from rq import Queue, Worker

    r = redis.Redis.from_url(rp.url, max_connections=THREADS * 2)
    q = Queue("hb" + uuid.uuid4().hex[:8], connection=r)
    ws = [Worker([q], connection=r, name=f"{q.name}-{i}") for i in range(workers)]
    try:
        for w in ws:
            w.register_birth()
        rate = workers / claims.RENEW_SECONDS
        sent, cpu, wall = claims.paced(ws, rate, seconds, THREADS, {"redis": rp.proc.pid})  # type: ignore[arg-type,union-attr]
        return {"rq_redis_cpu": cpu["redis"], "rq_beats_per_second": sent / wall}
    finally:
        for w in ws:
            w.register_death()
        r.close()


def run(rp: RedisProcess, counts: list[int], seconds: float) -> dict[str, Any]:
    out: dict[str, Any] = {"seconds": seconds, "counts": []}
    for n in counts:
        say(f"heartbeats: {n:,} simulated workers, {n / claims.RENEW_SECONDS:.0f} beats/s for {seconds:g} s")
        one = claims.server_load(rp, n, seconds, THREADS, full=False)
        one |= rq_paced(rp, n, seconds)
        # what one client process drove: the beats answered over the time until the last answer
        one["driven"] = one["paced_answered_per_second"] / one["paced_target_per_second"]
        say(
            f"heartbeats: {n:,}: {one['paced_heartbeats_per_second']:.0f} beats/s of "
            f"{one['paced_target_per_second']:.0f}; server {100 * one['paced_cpu']['server']:.0f} %, Redis "
            f"{100 * one['paced_cpu']['redis']:.0f} % of a core; rq's Redis {100 * one['rq_redis_cpu']:.0f} %"
        )
        out["counts"].append(one)
    return out


def rows(d: dict[str, Any], row: Callable[..., None]) -> None:
    for one in d["counts"]:
        n, target = one["workers"], one["paced_target_per_second"]
        short = one["driven"] < 0.9
        drove = f"driven {one['paced_answered_per_second']:.0f} beats/s answered of the {target:.0f}/s" + (
            " (what one client process could send on this box: not the production rate)" if short else ""
        )
        row(
            f"heartbeats, {n:,} workers every 10 s: server's CPU",
            "% core",
            "lower",
            100 * one["paced_cpu"]["server"],
            compare=False,
            note=drove,
        )
        row(
            f"  heartbeats, {n:,} workers every 10 s: Redis's CPU",
            "% core",
            "lower",
            100 * one["paced_cpu"]["redis"],
            other=("rq: Redis", 100 * one["rq_redis_cpu"]),
            note=f"rq: Worker.heartbeat() straight to Redis, {one['rq_beats_per_second']:.0f} beats/s",
        )
