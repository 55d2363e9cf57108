"""End-to-end job throughput and start latency: piloop beside rq and Celery, on one Redis started here.

    python bench/jobs.py [--jobs 2000] [--slots 8] [--latency 5]

Throughput: `--jobs` no-op jobs are queued first, then two workers start and drain them; the time runs from
the workers' spawn to the last job's end (so each side pays its workers' start-up once).
  piloop  `piloop serve --listen 127.0.0.1:<port>` (its own `serve` worker given no slots) and two remote
          `piloop worker --pool bench` processes over loopback TCP, each with `--slots` evaluation slots; each
          job is `true` under its own shim, with the production timings (renew 10 s, toleration 300 s).
  rq      two `rq worker --burst` processes (each forks a work horse per job).
  Celery  one `celery worker`, prefork, concurrency 2, the Redis broker, no result backend (the task INCRs a
          counter so the bench knows when it is done).
Start latency: one job at a time on idle workers (a quiet second after the last job), from just before the
submit call to the moment the job's process writes the time; the median of `--latency` jobs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from piloop_common.client import ApiClient  # noqa: E402
from piloop_server.state.keys import Keys  # noqa: E402
from piloop_server.tokens import TokenStore  # noqa: E402
from tests.helpers.redis import RedisProcess, free_port  # noqa: E402
from tests.helpers.serve import Daemon, cli_env, short_home  # noqa: E402

BIN = Path(sys.executable).parent


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def wait_until(cond, timeout: float, what: str, every: float = 0.05, report=None):
    end = time.monotonic() + timeout
    last = 0.0
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        if report and time.monotonic() - last > 5:
            last = time.monotonic()
            report()
        time.sleep(every)
    raise SystemExit(f"bench: timed out after {timeout}s waiting for {what}")


def stamp_time(path: Path):
    try:
        return float(path.read_text())
    except (OSError, ValueError):
        return None


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


def piloop_side(rp: RedisProcess, n: int, slots: int, lat_n: int, tmp: Path) -> tuple[float, float, float]:
    ns = "bj" + uuid.uuid4().hex[:8]
    d = Daemon(short_home("bench"), config=PILOOP_CONFIG.format(slots=slots), redis_url=rp.url, namespace=ns)
    port = free_port()
    d.start(listen=f"127.0.0.1:{port}")
    url = f"http://127.0.0.1:{port}"
    r = redis.Redis.from_url(rp.url)
    keys = Keys(ns)
    procs: list[subprocess.Popen] = []
    homes: list[Path] = []
    try:
        tokens = TokenStore(r, keys)
        ids: list[str] = []
        t0 = time.perf_counter()
        with d.api(timeout=30) as api:
            for i in range(n):
                ids.append(api.call("POST", "/v1/jobs", {"pool": "bench", "spec": {"argv": ["true"]}})["job"])
        say(f"piloop: {n} jobs queued in {time.perf_counter() - t0:.1f}s")
        t0 = time.perf_counter()
        for i in range(2):
            home = short_home("bw")
            homes.append(home)
            (home / "config.toml").write_text(f'[plugins.cas]\nprovider = "local"\npath = "{d.home}/cas"\n')
            env = cli_env(home, {"PILOOP_HTTPS_TOKEN": tokens.create(f"b{i}", by="human:bench")})
            log = open(home / "worker.log", "ab")
            procs.append(subprocess.Popen([sys.executable, "-m", "piloop_common.cli", "worker", "--server", url,
                                           "--pool", "bench"], env=env, stdout=log, stderr=log,
                                          stdin=subprocess.DEVNULL, start_new_session=True))

        def left() -> int:
            pipe = r.pipeline(transaction=False)
            pipe.zcard(keys.queue("bench", "evaluation"))
            pipe.scard(keys.active("bench", "evaluation"))
            q, a = pipe.execute()
            return q + a

        def report() -> None:
            done = n - left()
            el = time.perf_counter() - t0
            say(f"piloop: {done}/{n} done, {el:.0f}s, {done / el:.1f} jobs/s")

        wait_until(lambda: left() == 0, 3600, "piloop to drain", every=0.05, report=report)
        rate = n / (time.perf_counter() - t0)
        pipe = r.pipeline(transaction=False)
        for j in ids:
            pipe.hget(keys.job(j), "state")
        states = [s.decode() for s in pipe.execute()]
        bad = {s: states.count(s) for s in set(states) if s != "succeeded"}
        if bad:
            say(f"piloop: not all succeeded: {bad}")
        say(f"piloop: {rate:.1f} jobs/s")
        lats = []
        with d.api(timeout=30) as api:
            for i in range(lat_n):
                time.sleep(1.0)  # idle: both workers have had an empty claim
                mark = tmp / f"piloop-{i}"
                t = time.time()
                api.call("POST", "/v1/jobs", {"pool": "bench", "spec": {
                    "argv": ["sh", "-c", f"date +%s.%N > {mark}.tmp && mv {mark}.tmp {mark}"]}})
                started = wait_until(lambda: stamp_time(mark), 120, "a piloop job to start", every=0.002)
                lats.append(started - t)
                say(f"piloop: start latency {lats[-1] * 1000:.0f} ms")
        return rate, statistics.median(lats), 0.0
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        r.close()
        d.cleanup()
        for h in homes:
            shutil.rmtree(h, ignore_errors=True)




# -- rq -------------------------------------------------------------------------------------

def rq_side(rp: RedisProcess, n: int, lat_n: int, tmp: Path) -> tuple[float, float]:
    from rq import Queue

    from bench.tasks import noop, stamp

    r = redis.Redis.from_url(rp.url)
    name = "rq" + uuid.uuid4().hex[:8]
    q = Queue(name, connection=r)
    for _ in range(n):
        q.enqueue(noop)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t0 = time.perf_counter()
    procs = [subprocess.Popen([str(BIN / "rq"), "worker", "--burst", "--url", rp.url, "--quiet", name], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp) for _ in range(2)]
    wait_until(lambda: all(p.poll() is not None for p in procs), 3600, "rq to drain", every=0.01,
               report=lambda: say(f"rq: {n - len(q)} taken"))
    rate = n / (time.perf_counter() - t0)
    say(f"rq: {rate:.1f} jobs/s")
    procs = [subprocess.Popen([str(BIN / "rq"), "worker", "--url", rp.url, "--quiet", name], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp) for _ in range(2)]
    try:
        lats = []
        time.sleep(2.0)  # the workers are up and idle
        for i in range(lat_n):
            time.sleep(1.0)
            mark = tmp / f"rq-{i}"
            t = time.time()
            q.enqueue(stamp, str(mark))
            lats.append(wait_until(lambda: stamp_time(mark), 60, "an rq job to start", every=0.002) - t)
        return rate, statistics.median(lats)
    finally:
        for p in procs:
            p.terminate()
            p.wait(30)
        r.close()


# -- Celery ---------------------------------------------------------------------------------

def celery_side(rp: RedisProcess, n: int, lat_n: int, tmp: Path) -> tuple[float, float]:
    name = "cq" + uuid.uuid4().hex[:8]
    os.environ["PILOOP_BENCH_BROKER"], os.environ["PILOOP_BENCH_QUEUE"] = rp.url, name
    import importlib

    import bench.tasks

    tasks = importlib.reload(bench.tasks)
    r = redis.Redis.from_url(rp.url)
    for _ in range(n):
        tasks.celery_noop.apply_async()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t0 = time.perf_counter()
    proc = subprocess.Popen([str(BIN / "celery"), "-A", "bench.tasks", "worker", "--concurrency", "2", "--pool",
                             "prefork", "--loglevel", "WARNING", "--without-gossip", "--without-mingle",
                             "--without-heartbeat"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            cwd=tmp, start_new_session=True)
    try:
        done = lambda: int(r.get(f"{name}:done") or 0)  # noqa: E731
        wait_until(lambda: done() >= n, 3600, "Celery to drain", every=0.01,
                   report=lambda: say(f"celery: {done()}/{n} done"))
        rate = n / (time.perf_counter() - t0)
        say(f"celery: {rate:.1f} jobs/s")
        lats = []
        for i in range(lat_n):
            time.sleep(1.0)
            mark = tmp / f"celery-{i}"
            t = time.time()
            tasks.celery_stamp.apply_async((str(mark),))
            lats.append(wait_until(lambda: stamp_time(mark), 60, "a Celery job to start", every=0.002) - t)
        return rate, statistics.median(lats)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        r.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--slots", type=int, default=8, help="evaluation slots of each piloop worker")
    ap.add_argument("--latency", type=int, default=5, help="jobs for the start latency median")
    ap.add_argument("--only", choices=["piloop", "rq", "celery"], action="append")
    a = ap.parse_args()
    only = a.only or ["piloop", "rq", "celery"]
    rows: dict[str, tuple[float, float]] = {}
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        rp = RedisProcess(tmp / "redis").start()
        try:
            if "rq" in only:
                rows["rq (2 × rq worker)"] = rq_side(rp, a.jobs, a.latency, tmp)
            if "celery" in only:
                rows["Celery (prefork, concurrency 2)"] = celery_side(rp, a.jobs, a.latency, tmp)
            if "piloop" in only:
                rate, lat, _ = piloop_side(rp, a.jobs, a.slots, a.latency, tmp)
                rows[f"piloop (2 workers × {a.slots} slots)"] = (rate, lat)
        finally:
            rp.stop()
    base = rows.get("rq (2 × rq worker)")
    width = max(len(k) for k in rows)
    print(f"{'what'.ljust(width)}  {'jobs/s':>8}  {'× rq':>6}  {'start latency':>13}  {'× rq':>6}")
    for k, (rate, lat) in rows.items():
        r1 = f"{rate / base[0]:6.2f}" if base else "     -"
        r2 = f"{lat / base[1]:6.1f}" if base else "     -"
        print(f"{k.ljust(width)}  {rate:8.1f}  {r1}  {lat * 1000:10.0f} ms  {r2}")
    print(f"({a.jobs} no-op jobs drained by 2 workers from spawn to the last end; start latency: median of "
          f"{a.latency} jobs on idle workers, submit → the job's process runs; one machine, {os.cpu_count()} CPUs, "
          "one Redis)")


if __name__ == "__main__":
    main()
