"""Soak: a few hundred short jobs on the `serve` worker and two remote ones while a driver, at random, SIGKILLs and
restarts workers, SIGSTOPs and resumes the daemon (shorter and longer than grace), restarts `piloop serve`, and
kills Redis and starts it again from its AOF. Then, once everything drained: every evaluation succeeded exactly
once, no two runs of one job overlapped, every agent succeeded or ended `worker_lost`, no lease is left in Redis,
and every job's end is in the event stream.

Budget: `PILOOP_SOAK_SECONDS` (default 60; longer runs by hand) for the whole test. The seed is printed first; replay a run with
`PILOOP_SOAK_SEED=<seed>`. Each job appends its lines (job, worker, token, times) to a marker file outside piloop.
"""

from __future__ import annotations

import os
import random
import sys
import threading
import time
from collections import Counter

import psutil
import pytest

from piloop_common.errors import PiloopError
from tests.helpers.redis import RedisProcess, wait_for
from tests.helpers.workers import (
    ENDED,
    GRACE,
    MARKER_JOB,
    TOLERATION,
    RemoteWorker,
    events,
    kill_tree_of,
    marker_runs,
    overlapping,
    tcp_server,
    token,
)

pytestmark = pytest.mark.soak

POOLS = """
[plugins.executor.pools.gpu]
agents = 1
evaluations = 2
max_load = 1000
min_memory_gb = 0
"""


class Soak:
    def __init__(self, d, redis: RedisProcess, remotes: list[RemoteWorker], marker, rng: random.Random) -> None:
        self.d, self.redis, self.remotes, self.marker, self.rng = d, redis, remotes, marker, rng
        self.jobs: dict[str, str] = {}  # job -> kind
        self.figures: Counter = Counter()
        self.stop = threading.Event()
        self.errors: list[str] = []

    # -- jobs ------------------------------------------------------------------------------
    def submit(self, kind: str, pool: str, seconds: float) -> None:
        body = {
            "kind": kind,
            "pool": pool,
            "spec": {
                "argv": [sys.executable, "-c", MARKER_JOB],
                "env": {"MARKER": str(self.marker), "RUN_SECONDS": str(seconds)},
            },
        }
        end = time.monotonic() + 60
        while time.monotonic() < end:
            try:
                with self.d.api(timeout=15) as api:
                    job = api.call("POST", "/v1/jobs", body)["job"]
                self.jobs[job] = kind
                return
            except PiloopError:  # the daemon is restarting, or its Redis is down: a client retries
                time.sleep(0.2)
        self.errors.append(f"could not submit a {kind} for 60 s")

    def submitter(self, total: int, agents: int, window: float) -> None:
        kinds = ["agent"] * agents + ["evaluation"] * (total - agents)
        self.rng.shuffle(kinds)
        start = time.monotonic()
        for i, kind in enumerate(kinds):
            wait_for(lambda i=i: time.monotonic() >= start + window * i / total, window + 5, interval=0.05)
            pool = ("serve", "gpu")[i % 2]
            self.submit(kind, pool, 2.0 if kind == "agent" else self.rng.uniform(0.1, 0.4))

    # -- faults ----------------------------------------------------------------------------
    def kill_remote(self) -> None:
        w = self.rng.choice(self.remotes)
        w.kill()
        self.figures["worker kills"] += 1
        self.stop.wait(self.rng.uniform(0.2, 3.0))
        w.start()
        self.figures["worker restarts"] += 1

    def kill_serve_worker(self) -> None:
        # the daemon's own worker: the daemon restarts it (after 1 s, doubling while it keeps dying)
        for p in psutil.Process(self.d.proc.pid).children():
            if "--name" in p.cmdline() and "serve" in p.cmdline():
                for c in p.children():
                    c.kill()
                p.kill()
                self.figures["worker kills"] += 1

    def pause_daemon(self) -> None:
        seconds = self.rng.choice([GRACE / 2, GRACE + 1.0, TOLERATION + 1.0])
        self.d.pause()
        self.stop.wait(seconds)
        self.d.resume()
        self.figures["daemon pauses"] += 1
        self.figures["daemon pauses > grace"] += seconds > GRACE

    def restart_serve(self) -> None:
        self.d.stop()  # SIGTERM, as `piloop stop` sends: its worker detaches, jobs run on under their shims
        self.d.start(listen=self.d.listen)
        self.figures["serve restarts"] += 1

    def restart_redis(self) -> None:
        self.redis.stop(kill=True)
        self.stop.wait(self.rng.uniform(0.0, 2.0))
        self.redis.start()
        self.figures["redis restarts"] += 1

    def driver(self, until: float) -> None:
        actions = [self.kill_remote] * 4 + [
            self.kill_serve_worker,
            self.pause_daemon,
            self.pause_daemon,
            self.restart_serve,
            self.restart_redis,
        ]
        while time.monotonic() < until and not self.stop.is_set():
            self.stop.wait(self.rng.uniform(1.0, 4.0))
            if time.monotonic() >= until:
                break
            act = self.rng.choice(actions)
            try:
                act()
            except Exception as e:  # a fault the harness could not make is a failure of the test, not a crash
                self.errors.append(f"{act.__name__}: {type(e).__name__}: {e}")
                return


def _story(d, job: str, evs: list[dict] | None = None) -> list[tuple]:
    """One job's events, short: (type, token, worker, then/outcome/reason)."""
    return [
        (
            e["type"],
            e.get("token", ""),
            e.get("worker") or e.get("by", ""),
            e.get("then") or e.get("outcome") or e.get("reason") or "",
        )
        for e in (evs if evs is not None else events(d))
        if e.get("job") == job
    ]


def test_soak(tmp_path, namespace):
    budget = float(os.environ.get("PILOOP_SOAK_SECONDS", "60"))
    seed = int(os.environ.get("PILOOP_SOAK_SEED") or random.SystemRandom().randrange(1 << 32))
    print(f"\nsoak: seed={seed} budget={budget:g}s (replay: PILOOP_SOAK_SEED={seed})", flush=True)
    rng = random.Random(seed)
    began = time.monotonic()
    # chaos and submissions in the first half; the rest is for the last fault to heal and the queue to drain
    chaos_until = began + budget * 0.5
    drain_deadline = began + budget - 3

    redis = RedisProcess(tmp_path / "redis").start()
    d = tcp_server(redis.url, namespace, extra=POOLS)
    remotes = [RemoteWorker(d, token(d, name)) for name in ("wa", "wb")]
    marker = tmp_path / "marker"
    soak = Soak(d, redis, remotes, marker, rng)
    try:
        for w in remotes:
            w.start()
        total = max(20, int(budget * 2))
        agents = max(2, total // 40)
        sub = threading.Thread(target=soak.submitter, args=(total, agents, budget * 0.45), daemon=True)
        drv = threading.Thread(target=soak.driver, args=(chaos_until,), daemon=True)
        sub.start()
        drv.start()
        sub.join(budget)
        drv.join(budget)
        assert not soak.errors, soak.errors
        # drain: everything up again, then every job to an end
        d.resume()
        for w in remotes:
            if not w.alive:
                w.start()

        def drained() -> bool:
            with d.api() as api:
                left = [j for j in soak.jobs if api.call("GET", f"/v1/jobs/{j}")["state"] not in ENDED]
            return not left

        try:
            wait_for(
                drained,
                max(10.0, drain_deadline - time.monotonic()),
                interval=0.5,
                what=f"all {len(soak.jobs)} jobs to end (seed {seed})",
            )
        except AssertionError:
            with d.api() as api:
                left = [v for j in soak.jobs if (v := api.call("GET", f"/v1/jobs/{j}"))["state"] not in ENDED]
            for v in left[:5]:
                print(
                    f"soak: not ended: {v['id']} {v['state']} worker={v['worker']} token={v['token']} "
                    f"lost={v['lost']} reason={v['reason']!r} events={_story(d, v['id'])}",
                    flush=True,
                )
            raise
        with d.api() as api:
            views = {j: api.call("GET", f"/v1/jobs/{j}") for j in soak.jobs}
        evs = events(d)
        runs = marker_runs(marker)
        import redis as redis_py

        with redis_py.Redis.from_url(redis.url) as r:
            leases_left = list(r.scan_iter(match=f"{{{namespace}}}:lease:*"))

        ends = Counter((e["job"], e["type"]) for e in evs if e["type"].startswith("job.") and "job" in e)
        expired_lost = {e["job"] for e in evs if e["type"] == "lease.expired" and e.get("then") == "worker_lost"}
        evals = [j for j, k in soak.jobs.items() if k == "evaluation"]
        agents_ = [j for j, k in soak.jobs.items() if k == "agent"]
        bad_evals = {j: views[j]["state"] for j in evals if views[j]["state"] != "succeeded"}
        doubled = [j for j in soak.jobs if ends[(j, "job.succeeded")] > 1]
        overlaps = [j for j in soak.jobs if overlapping(runs.get(j, []))]
        lost_agents = [j for j in agents_ if views[j]["state"] == "worker_lost"]
        bad_agents = {j: views[j]["state"] for j in agents_ if views[j]["state"] not in ("succeeded", "worker_lost")}
        no_end_event = [j for j in soak.jobs if not ends[(j, f"job.{views[j]['state']}")] and j not in expired_lost]
        reruns = sum(1 for j in soak.jobs if len(runs.get(j, [])) > 1)
        f = soak.figures
        print(
            f"soak: seed={seed} jobs={len(soak.jobs)} (evaluations={len(evals)} agents={len(agents_)}) "
            f"worker_kills={f['worker kills']} worker_restarts={f['worker restarts']} "
            f"daemon_pauses={f['daemon pauses']} (>grace {f['daemon pauses > grace']}) "
            f"serve_restarts={f['serve restarts']} redis_restarts={f['redis restarts']} "
            f"reruns={reruns} duplicates={len(doubled)} overlaps={len(overlaps)} lost_agents={len(lost_agents)} "
            f"lost_evaluations={len(bad_evals)} seconds={time.monotonic() - began:.0f}",
            flush=True,
        )
        for j in list(bad_evals)[:5]:
            print(
                f"soak: {j} ended {views[j]['state']} lost={views[j]['lost']} reason={views[j]['reason']!r} "
                f"events={_story(d, j, evs)}",
                flush=True,
            )
        assert not bad_evals, f"evaluations that did not succeed (seed {seed}): {bad_evals}"
        assert not doubled, f"jobs that succeeded twice (seed {seed}): {doubled}"
        assert not overlaps, f"jobs that ran twice at once (seed {seed}): {[runs[j] for j in overlaps]}"
        assert not bad_agents, f"agents that ended neither succeeded nor worker_lost (seed {seed}): {bad_agents}"
        assert not leases_left, f"leases left in Redis (seed {seed}): {leases_left}"
        assert not no_end_event, f"jobs whose end is not in the event stream (seed {seed}): {no_end_event}"
        assert all(len(runs.get(j, [])) >= 1 for j in evals)
    finally:
        soak.stop.set()
        for w in remotes:
            w.cleanup()
        d.cleanup()
        kill_tree_of(str(d.home))
        redis.stop(kill=True)
