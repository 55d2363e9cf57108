"""Jobs end to end: drain throughput and start latency of piloop, rq and Celery, on one Redis.

    python bench/jobs.py [--jobs 2000] [--latency 200] [--only piloop|rq|celery]   (or `python -m bench` for all)

Drain: `jobs` no-op jobs are queued first, then two workers start and drain them; the time runs from the workers'
spawn to the last job's end (so each side pays its workers' start-up once).
  piloop        `piloop serve --listen 127.0.0.1:<port>` (its `serve` worker given no slots) and two remote
                `piloop worker --pool bench` over loopback TCP, 8 evaluation slots each, production timings (renew
                10 s). A process job runs `/bin/true` spawned by its slot's supervisor; a task job (runner `task`)
                runs `bench.noop:noop` in the slot's warm task process (its args and value inline in the claim and
                the report).
  rq            two `rq worker --burst`: `Worker` forks a work horse per job, `SimpleWorker` runs it in-process.
  Celery        prefork: one `celery worker --concurrency 2`; solo: two `celery worker --pool solo`. Redis
                broker, no result backend (a finished task INCRs a counter, so the bench knows when all are done).
Like with like: the peers' "subprocess" task runs `/bin/true` with `subprocess.run` (what a piloop process job
does), their "Python" task is a plain function call (what a piloop task is, minus its own process).
Start latency: one job at a time on idle workers, from just before the submit call to the job's first line writing
the wall time to a file; median and p99.
RSS: a worker's long-lived processes (piloop: the worker and its slot supervisors; rq: the worker; Celery: the main
process and its pool), at rest (idle, after the latency warm-up) and the most seen while draining.
CPU a job of a drain: the server, the workers' long-lived processes with what they reaped, Redis and the whole
machine; piloop's also by process (`piloop_cpu`: the worker, its slot supervisors, the jobs' processes), a peer's
jobs' processes apart (what its workers reaped).
This module holds piloop's side (`PiloopSide`) and `main`; the peers' sides are in bench/peers.py, the measuring
(`Drain`, `Latency`, `RssWatch`, `CpuWatch`, `piloop_cpu`, ...) in bench/measure.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

if str(Path(__file__).resolve().parent.parent) not in sys.path:  # run as `python bench/jobs.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil
import redis

from bench.measure import (
    ROOT,
    CpuWatch,
    Drain,
    Latency,
    RssWatch,
    compile_piloop,
    long_lived,
    piloop_cpu,
    rss_mib,
    say,
    stamp_time,
    stop_procs,
    wait_until,
)
from bench.peers import CELERY_TASK, PY_JOB, RQ_CLASSES, celery_drain, rq_drain
from piloop_common.bytecaps import inline
from piloop_server.state.keys import Keys
from piloop_server.tokens import TokenStore
from tests.helpers.redis import RedisProcess, free_port
from tests.helpers.serve import Daemon, cli_env, short_home

# -- piloop ---------------------------------------------------------------------------------

PILOOP_CONFIG = """
[plugins.executor.pools.serve]
agents = 0
evaluations = 0

[plugins.executor.pools.bench]
agents = 0
evaluations = {slots}
max_load = 100000
min_memory_gb = 0
"""


class PiloopSide:
    """`piloop serve` on loopback TCP with a pool `bench`, and remote workers on demand.

    With `profile`, the server runs under yappi and each worker under cProfile (see `bench/profiled.py`), their
    stats written to that directory when they stop; `BENCH_PROFILE=server` or `worker` profiles only that side, and
    `BENCH_WORKER_PROFILER=yappi` profiles the workers' threads too."""

    def __init__(
        self,
        rp: RedisProcess,
        slots: int = 8,
        profile: Path | None = None,
        executor: str = "",
        worker_dirs: Path | None = None,
    ) -> None:
        self.ns = "bj" + uuid.uuid4().hex[:8]
        self.slots, self.profile = slots, profile
        self.worker_dirs = worker_dirs  # each worker's --dir a fresh dir under it; None: $PILOOP_HOME/work/<name>
        config = executor + PILOOP_CONFIG.format(slots=slots)  # `executor`: a [plugins.executor] table of timings
        self.daemon = Daemon(short_home("bench"), config=config, redis_url=rp.url, namespace=self.ns)
        self.r = redis.Redis.from_url(rp.url)
        self.redis_pid = rp.proc.pid  # type: ignore[union-attr]
        self.keys = Keys(self.ns)
        self.homes: list[Path] = []
        self.n_workers = 0

    def start(self) -> PiloopSide:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        if self.profile is None or os.environ.get("BENCH_PROFILE") == "worker":
            self.daemon.start(listen=f"127.0.0.1:{port}")
        else:
            self._start_profiled(port)
        self.tokens = TokenStore(self.r, self.keys)
        self.pid = self.daemon.proc.pid  # type: ignore[union-attr]
        return self

    def _start_profiled(self, port: int) -> None:
        d = self.daemon
        (d.home / "logs").mkdir(exist_ok=True)
        log = open(d.home / "logs" / "test-daemon.log", "ab")
        args = [
            sys.executable,
            str(ROOT / "bench" / "profiled.py"),
            "yappi",
            str(self.profile / "server.prof"),
            "-m",
            "piloop_common.cli",
            "serve",
            "--listen",
            f"127.0.0.1:{port}",
        ]
        d.proc = subprocess.Popen(args, env=cli_env(d.home, d.env), stdout=log, stderr=log, start_new_session=True)
        wait_until(d.healthy, 60, "the profiled server")

    def api(self, timeout: float = 30):
        return self.daemon.api(timeout=timeout)

    def spawn_workers(
        self, n: int = 2, task_processes: str = "warm", wrap: Sequence[str] = ()
    ) -> list[subprocess.Popen]:
        """`n` remote workers; `wrap`: a command each runs under (`strace ...`, bench/syscalls.py)."""
        procs = []
        for _ in range(n):
            i = self.n_workers
            self.n_workers += 1
            home = short_home("bw")
            self.homes.append(home)
            (home / "config.toml").write_text(f'[plugins.cas]\nprovider = "local"\npath = "{self.daemon.home}/cas"\n')
            env = cli_env(
                home, {"PILOOP_HTTPS_TOKEN": self.tokens.create(f"b{i}", by="human:bench"), "PYTHONPATH": str(ROOT)}
            )
            log = open(home / "worker.log", "ab")
            cmd = ["-m", "piloop_common.cli", "worker", "--server", self.url, "--pool", "bench"]
            cmd += ["--task-processes", task_processes]
            if self.worker_dirs is not None:
                cmd += ["--dir", tempfile.mkdtemp(prefix="bw-", dir=self.worker_dirs)]
            if self.profile is not None and os.environ.get("BENCH_PROFILE") != "server":
                profiler = os.environ.get(
                    "BENCH_WORKER_PROFILER", "cprofile"
                )  # yappi: every thread, not the loop's only
                cmd = [str(ROOT / "bench" / "profiled.py"), profiler, str(self.profile / f"worker-{i}.prof"), *cmd]
            procs.append(
                subprocess.Popen(
                    [*wrap, sys.executable, *cmd],
                    env=env,
                    stdout=log,
                    stderr=log,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                    cwd=home,
                )
            )
        return procs

    def left(self) -> int:
        pipe = self.r.pipeline(transaction=False)
        pipe.zcard(self.keys.queue("bench", "evaluation"))
        pipe.scard(self.keys.active("bench", "evaluation"))
        q, a = pipe.execute()
        return q + a

    def spec(self, api, what: str, stamp: Path | None = None) -> dict[str, Any]:
        if what == "task":
            args = [str(stamp)] if stamp else []
            # small arguments ride in the spec, as the SDK sends them (`bytecaps.inline`)
            carried = inline(json.dumps({"args": args, "kwargs": {}}).encode())
            assert carried is not None
            return {
                "runner": "task",
                "argv": ["bench.noop:stamp" if stamp else "bench.noop:noop"],
                "inline_inputs": {"args.json": carried},
            }
        if stamp:
            return {"argv": ["sh", "-c", f"date +%s.%N > {stamp}.tmp && mv {stamp}.tmp {stamp}"]}
        return {"argv": ["/bin/true"]}

    def drain(self, n: int, what: str) -> Drain:
        ids: list[str] = []
        t0 = time.perf_counter()
        kind, _, processes = what.partition(" ")  # "task fresh": a task in a process forked for it
        with self.api() as api:
            spec = self.spec(api, kind)
            for _ in range(n):
                ids.append(api.call("POST", "/v1/jobs", {"pool": "bench", "spec": spec})["job"])
        say(f"piloop {what}: {n} jobs queued in {time.perf_counter() - t0:.1f}s")
        t0 = time.perf_counter()
        procs = self.spawn_workers(2, processes or "warm")
        try:
            groups = {"server": [self.pid], **{f"w{i}": [p.pid] for i, p in enumerate(procs)}}
            cpu = CpuWatch({"server": [self.pid], "workers": [p.pid for p in procs], "redis": [self.redis_pid]})
            with RssWatch(groups) as watch:

                def report() -> None:
                    done = n - self.left()
                    say(f"piloop {what}: {done}/{n} done, {done / (time.perf_counter() - t0):.1f} jobs/s")

                wait_until(lambda: self.left() == 0, 3600, f"piloop {what} to drain", every=0.02, report=report)
                seconds = time.perf_counter() - t0
                cpu_ms = cpu.per_job_ms(n)
                # every one of these processes was born in this drain: each one's CPU since its birth is its part
                cpu_ms |= {k: v * 1000 / n for k, v in piloop_cpu([p.pid for p in procs]).items()}
        finally:
            stop_procs(procs, group=True)
        pipe = self.r.pipeline(transaction=False)
        for j in ids:
            pipe.hget(self.keys.job(j), "state")
        states = [s.decode() for s in pipe.execute()]
        bad = sum(1 for s in states if s != "succeeded")
        d = Drain(n, seconds, bad, max(v for k, v in watch.peak.items() if k != "server"), watch.peak["server"], cpu_ms)
        say(
            f"piloop {what}: {d.rate:.1f} jobs/s, CPU ms per job "
            + ", ".join(f"{k} {v:.1f}" for k, v in cpu_ms.items())
            + (f", {bad} did not succeed" if bad else "")
        )
        return d

    def latency(self, k: int, gap: float, tmp: Path, whats: Sequence[str] = ("process", "task")) -> dict[str, Latency]:
        procs = self.spawn_workers(2)
        out = {w: Latency() for w in whats}
        try:
            with self.api() as api:
                for what in whats:
                    for i in range(-1, k):  # -1: the warm-up job
                        time.sleep(gap)
                        mark = tmp / f"piloop-{what}-{i}-{uuid.uuid4().hex[:6]}"
                        t = time.time()
                        api.call("POST", "/v1/jobs", {"pool": "bench", "spec": self.spec(api, what, stamp=mark)})
                        started = wait_until(
                            lambda mark=mark: stamp_time(mark), 120, "a piloop job to start", every=0.001
                        )
                        if i >= 0:
                            out[what].samples.append(started - t)
                    say(
                        f"piloop {what}: start latency median {out[what].median_ms:.0f} ms, p99 "
                        f"{out[what].p99_ms:.0f} ms"
                    )
            wait_until(lambda: self.left() == 0, 60, "the last latency job to be reported")
            time.sleep(gap)
            rest = max(rss_mib([psutil.Process(p) for p in long_lived(w.pid)]) for w in procs)
            for what in whats:
                out[what].worker_rss_mib = rest
        finally:
            stop_procs(procs, group=True)
        return out

    def server_rss_mib(self) -> float:
        return rss_mib([psutil.Process(self.pid)])

    def close(self) -> None:
        self.r.close()
        if self.profile is not None and self.daemon.proc is not None:
            self.daemon.stop()  # a clean stop, so the profile is written
        self.daemon.cleanup()
        for h in self.homes:
            shutil.rmtree(h, ignore_errors=True)


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--latency", type=int, default=200, help="jobs for the start latency median and p99")
    ap.add_argument("--gap", type=float, default=0.2, help="idle seconds before each latency job")
    ap.add_argument("--only", choices=["piloop", "rq", "celery"], action="append")
    a = ap.parse_args()
    compile_piloop()
    only = a.only or ["piloop", "rq", "celery"]
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        rp = RedisProcess(tmp / "redis").start()
        try:
            if "piloop" in only:
                side = PiloopSide(rp).start()
                try:
                    for what in ("process", "task", "task fresh"):
                        out[f"piloop {what}"] = asdict(side.drain(a.jobs, what))
                    out["piloop latency"] = {k: asdict(v) for k, v in side.latency(a.latency, a.gap, tmp).items()}
                finally:
                    side.close()
            if "rq" in only:
                for cls in RQ_CLASSES:
                    for job in PY_JOB:
                        out[f"rq {cls} {job}"] = asdict(rq_drain(rp, a.jobs, cls, job, tmp))
            if "celery" in only:
                for pool in ("prefork", "solo"):
                    for job in CELERY_TASK:
                        out[f"celery {pool} {job}"] = asdict(celery_drain(rp, a.jobs, pool, job, tmp))
        finally:
            rp.stop()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
