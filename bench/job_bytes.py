"""Redis bytes a queued and a finished job: piloop, rq, and Celery with its Redis result backend, `n` no-op jobs
each on the same redis-server (a short version of the retention soak's figure, `python -m bench.soak`).

Queued: the MEMORY USAGE of the keys that `n` jobs queued and not yet taken made (bench/depth.py's fills: piloop's
enqueue script, rq's `enqueue_many`, Celery's `send_task`). Finished: piloop's `n` jobs driven the server's way (submit, claim,
report: bench/soak.py's `one_round`) under the default retention, so each is kept; rq's and Celery's through their
workers (bench/peers_memory.py), each at its own defaults (rq: result_ttl 500 s; Celery: result_expires 1 day).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from bench import depth, peers_memory, soak
from bench.measure import say
from piloop_common.protocol.worker import JobSpec
from tests.helpers.redis import RedisProcess

RETAINED = 7 * 86400  # past the run: every finished job is kept while measured


def piloop_finished(rp: RedisProcess, tmp: Path, n: int) -> int:
    rt = soak.runtime(rp, tmp / "bytes-home", RETAINED)
    try:
        used0 = int(rt.redis.info("memory")["used_memory"])
        done = 0
        while done < n:
            done += soak.one_round(rt, min(soak.BATCH, n - done), JobSpec(argv=["true"]))
        return round((int(rt.redis.info("memory")["used_memory"]) - used0) / n)
    finally:
        rt.redis.close()


def run(rp: RedisProcess, tmp: Path, n: int) -> dict[str, Any]:
    out: dict[str, Any] = {"jobs": n}
    r = redis.Redis.from_url(rp.url)
    try:
        out["piloop_queued"] = depth.piloop_depth(r, tmp, n, 0)["bytes_per_queued_job"]
        out["rq_queued"] = depth.rq_depth(r, n, 0)["rq_bytes_per_queued_job"]
        out["celery_queued"] = depth.celery_bytes(rp, r, n)
    finally:
        r.close()  # the finished jobs' measures wait for Redis to have one client
    say(f"bytes: queued: piloop {out['piloop_queued']} B, rq {out['rq_queued']} B, Celery {out['celery_queued']} B")
    out["piloop_finished"] = piloop_finished(rp, tmp, n)
    say(f"bytes: piloop: {out['piloop_finished']} B a finished job")
    out["rq_finished"] = peers_memory.rq_cost(rp, n, tmp).bytes_per_job
    out["celery_finished"] = peers_memory.celery_cost(rp, n, tmp).bytes_per_job
    return out


def rows(d: dict[str, Any], row: Callable[..., None]) -> None:
    for what, note in (
        ("queued", "rq, Celery: enqueued only, whatever the worker"),
        (
            "finished",
            "piloop: kept for the retention (finished_seconds); rq: result_ttl 500 s; Celery: Redis result backend, "
            "result_expires 1 day",
        ),
    ):
        row(
            f"Redis bytes a {what} job ({d['jobs']:,} jobs)",
            "B",
            "lower",
            d[f"piloop_{what}"],
            {
                "rq SimpleWorker" if what == "finished" else "rq Worker": d[f"rq_{what}"],
                "Celery solo" if what == "finished" else "Celery prefork": d[f"celery_{what}"],
            },
            note=note,
        )
