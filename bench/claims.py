"""Claims and heartbeats per second: the Lua scripts alone, and through the HTTP API, beside rq.

All on one redis-server started here. Usage: python bench/claims.py [--jobs N] [--workers N]
Prints a table; rates are the median of the runs, ratios are against rq's enqueue+dequeue of the
same number of jobs on the same Redis.

`server_load` (used by `python -m bench`) is what one server holds with 1,000 simulated workers over HTTP: claims/s
and heartbeats/s flat out (8 client threads), then heartbeats paced at the production rate (each worker every
`renew_seconds`), each with the CPU the server process and redis-server spent, as a share of one core.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil
import redis

from piloop_common.errors import Unavailable
from piloop_common.sdk.client import ApiClient
from piloop_server.state.generation import GenerationRecord, ensure_generation
from piloop_server.state.keys import Keys
from piloop_server.state.leases import LeasesState
from piloop_server.state.records.lease import Timings
from piloop_server.tokens import TokenStore
from tests.helpers.redis import RedisProcess, free_port
from tests.helpers.serve import Daemon, short_home
from tests.helpers.simworker import SimWorker, sample

TIMINGS = Timings(grace_ms=60_000, toleration_ms=600_000)
# a server for simulated workers: production timings, its own worker given no slots, one pool that takes any load
SERVER_CONFIG = """
[plugins.executor]
renew_seconds = 10
grace_seconds = 60
toleration_seconds = 600
[plugins.executor.pools.serve]
agents = 0
evaluations = 0
[plugins.executor.pools.bench]
agents = 0
evaluations = 100000
max_load = 100000
min_memory_gb = 0
"""


def fresh(r: redis.Redis, tmp: Path) -> LeasesState:
    keys = Keys("b" + uuid.uuid4().hex[:8])
    ensure_generation(r, keys, GenerationRecord(tmp / f"{keys.namespace}.json"), 0)
    return LeasesState(r, keys, TIMINGS)


def fill(lz: LeasesState, n: int, pool: str = "bench") -> None:
    for i in range(n):
        lz.enqueue(f"j{i}", "evaluation", pool, {"argv": ["true"]}, by="human:bench")


def lua_claims(r: redis.Redis, tmp: Path, n: int) -> float:
    lz = fresh(r, tmp)
    lz.register("w", "bench", "", "cas", {}, protocol=1, by="worker:w")
    fill(lz, n)
    t = time.perf_counter()
    got = 0
    while got < n:
        got += len(lz.claim("w", "bench", "evaluation", slots=n, image="", most=1).leases)
    return n / (time.perf_counter() - t)


def lua_heartbeats(r: redis.Redis, tmp: Path, workers: int, rounds: int) -> float:
    lz = fresh(r, tmp)
    names = [f"w{i}" for i in range(workers)]
    fill(lz, workers)
    held = {}
    for w in names:
        lz.register(w, "bench", "", "cas", {}, protocol=1, by=f"worker:{w}")
        held[w] = lz.claim(w, "bench", "evaluation", slots=1, image="").leases
    t = time.perf_counter()
    for _ in range(rounds):
        for w in names:
            lz.heartbeat(w, {"load1": 0.1}, held[w])
    return workers * rounds / (time.perf_counter() - t)


def rq_rate(r: redis.Redis, n: int) -> float:
    from rq import Queue

    from bench.noop import noop

    q = Queue("b" + uuid.uuid4().hex[:8], connection=r)
    t = time.perf_counter()
    for _ in range(n):
        q.enqueue(noop)
    for _ in range(n):
        Queue.dequeue_any([q], None, connection=r)
    return n / (time.perf_counter() - t)


def http_rates(rp: RedisProcess, n: int, workers: int) -> tuple[float, float]:
    ns = "h" + uuid.uuid4().hex[:8]
    d = Daemon(short_home("bench"), config=SERVER_CONFIG, redis_url=rp.url, namespace=ns)
    port = free_port()
    d.start(listen=f"127.0.0.1:{port}")
    try:
        r = redis.Redis.from_url(rp.url)
        keys = Keys(ns)
        tokens = TokenStore(r, keys)
        with d.api() as api:
            cas_id = api.call("GET", "/v1/status")["cas"]["id"]
        lz = LeasesState(r, keys, TIMINGS)
        fill(lz, n)
        w = SimWorker(
            ApiClient(url=f"http://127.0.0.1:{port}", token=tokens.create("claimer", by="human:bench")), "bench", cas_id
        )
        w.register()
        t = time.perf_counter()
        got = 0
        while got < n:
            got += len(w.claim(evaluation=1)["leases"])
        claims = n / (time.perf_counter() - t)
        sims = []
        for i in range(workers):
            s = SimWorker(
                ApiClient(url=f"http://127.0.0.1:{port}", token=tokens.create(f"w{i}", by="human:bench")),
                "bench",
                cas_id,
            )
            s.sample = sample()
            s.register()
            sims.append(s)
        t = time.perf_counter()
        with ThreadPoolExecutor(8) as ex:
            list(ex.map(lambda s: s.heartbeat(), sims))
        beats = workers / (time.perf_counter() - t)
        return claims, beats
    finally:
        d.cleanup()


class Cpu:
    """CPU seconds a set of processes spent between enter and exit, as a share of one core of the wall time."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.procs = {k: psutil.Process(p) for k, p in pids.items()}
        self.share: dict[str, float] = {}

    def _cpu(self) -> dict[str, float]:
        return {k: sum(p.cpu_times()[:2]) for k, p in self.procs.items()}

    def __enter__(self) -> Cpu:
        self.t, self.c = time.perf_counter(), self._cpu()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.t
        now = self._cpu()
        self.share = {k: (now[k] - self.c[k]) / self.wall for k in now}


def rq_heartbeats(r: redis.Redis, workers: int) -> float:
    """rq's own liveness: `Worker.heartbeat()` of `workers` registered rq workers, one after another."""
    from rq import Queue, Worker

    q = Queue("b" + uuid.uuid4().hex[:8], connection=r)
    ws = [Worker([q], connection=r, name=f"{q.name}-{i}") for i in range(workers)]
    for w in ws:
        w.register_birth()
    t = time.perf_counter()
    for w in ws:
        w.heartbeat()
    rate = workers / (time.perf_counter() - t)
    for w in ws:
        w.register_death()
    return rate


def once_more(fn: Any) -> Any:
    """A call, and once more if the server was unreachable (a real worker retries too): one failed call of
    thousands must not end the run."""
    try:
        return fn()
    except Unavailable:
        return fn()


def paced(
    sims: list[SimWorker], rate: float, seconds: float, threads: int, pids: dict[str, int]
) -> tuple[int, dict[str, float], float]:
    """Heartbeats from `sims` in turn, `rate` a second for `seconds`, spread evenly; how many were sent, the CPU
    `pids` spent meanwhile, and the seconds until the last was answered (past `seconds` when answers lag)."""
    sent = 0
    with ThreadPoolExecutor(threads) as ex, Cpu(pids) as cpu:
        t0 = time.perf_counter()
        futures = []
        while (el := time.perf_counter() - t0) < seconds:
            due = int(el * rate)
            while sent < due:
                futures.append(ex.submit(once_more, sims[sent % len(sims)].heartbeat))
                sent += 1
            time.sleep(0.005)
        for f in futures:
            f.result()
    return sent, cpu.share, cpu.wall


def floor_cpu(workers: int, rate: float, seconds: float, threads: int, cas_id: str) -> float:
    """The share of a core a bare uvicorn app (`bench/floor.py`) spends on the same paced heartbeats from as many
    kept-alive connections: what the HTTP server alone costs on this machine now."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve().parent / "floor.py"), str(port)], stdin=subprocess.DEVNULL
    )
    sims: list[SimWorker] = []
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("bench/floor.py did not start") from None
                time.sleep(0.05)
        sims = [SimWorker(ApiClient(url=f"http://127.0.0.1:{port}"), "bench", cas_id) for _ in range(workers)]
        for s in sims:
            s.sample = sample()
        with ThreadPoolExecutor(threads) as ex:
            list(ex.map(lambda s: once_more(s.heartbeat), sims))  # each connection made, as piloop's were
        return paced(sims, rate, seconds, threads, {"floor": proc.pid})[1]["floor"]
    finally:
        for s in sims:
            s.api.close()
        proc.terminate()
        proc.wait(10)


def server_load(
    rp: RedisProcess, workers: int = 1000, paced_seconds: float = 10.0, threads: int = 8, full: bool = True
) -> dict[str, Any]:
    """Claims/s and heartbeats/s of one `piloop serve` with `workers` simulated workers, with its and Redis's CPU.
    Without `full`, only the heartbeats paced at the production rate (the `heartbeats` figure): no flat-out claims
    and heartbeats, no floor, no rq."""
    ns = "h" + uuid.uuid4().hex[:8]
    d = Daemon(short_home("bench"), config=SERVER_CONFIG, redis_url=rp.url, namespace=ns)
    port = free_port()
    d.start(listen=f"127.0.0.1:{port}")
    out: dict[str, Any] = {"workers": workers}
    r = redis.Redis.from_url(rp.url)
    try:
        keys = Keys(ns)
        tokens = TokenStore(r, keys)
        with d.api() as api:
            cas_id = api.call("GET", "/v1/status")["cas"]["id"]
        lz = LeasesState(r, keys, TIMINGS)
        fill(lz, workers)
        pids = {"server": d.proc.pid, "redis": rp.proc.pid}  # type: ignore[union-attr]
        out["server_rss_rest_mib"] = psutil.Process(d.proc.pid).memory_info().rss / 2**20  # type: ignore[union-attr]
        sims = []
        for i in range(workers):
            s = SimWorker(
                ApiClient(url=f"http://127.0.0.1:{port}", token=tokens.create(f"w{i}", by="human:bench")),
                "bench",
                cas_id,
            )
            s.sample = sample()
            sims.append(s)
        with ThreadPoolExecutor(threads) as ex:
            list(ex.map(lambda s: once_more(s.register), sims))
            if full:
                flat_out(ex, sims, pids, out)
            else:
                list(ex.map(lambda s: once_more(s.heartbeat), sims))  # each connection made before the pacing
        # the production rate: each worker once per renew period (10 s), spread evenly
        rate = workers / RENEW_SECONDS
        out["paced_target_per_second"] = rate
        stop = threading.Event()
        peak = [0.0]

        def watch() -> None:
            p = psutil.Process(d.proc.pid)  # type: ignore[union-attr]
            while not stop.wait(0.1):
                peak[0] = max(peak[0], p.memory_info().rss / 2**20)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        sent, out["paced_cpu"], wall = paced(sims, rate, paced_seconds, threads, pids)
        stop.set()
        watcher.join()
        out["paced_heartbeats_per_second"] = sent / paced_seconds
        out["paced_answered_per_second"] = sent / wall  # past `paced_seconds` while the beats sent wait on answers
        out["server_rss_load_mib"] = peak[0]
        if full:
            out["floor_cpu"] = floor_cpu(workers, rate, paced_seconds, threads, cas_id)
            out["rq_heartbeats_per_second"] = rq_heartbeats(r, workers)
            out["rq_dequeues_per_second"] = rq_rate(r, workers)
        for s in sims:
            s.api.close()
        return out
    finally:
        r.close()
        d.cleanup()


RENEW_SECONDS = 10.0  # the production heartbeat period (`renew_seconds`'s default)


def flat_out(ex: ThreadPoolExecutor, sims: list[SimWorker], pids: dict[str, int], out: dict[str, Any]) -> None:
    """One claim from each of `sims`, then one heartbeat from each, as fast as `ex`'s threads go, with the CPU."""
    with Cpu(pids) as cpu:
        t = time.perf_counter()
        got = sum(len(g["leases"]) for g in ex.map(lambda s: once_more(lambda: s.claim(evaluation=1)), sims))
        out["claims_per_second"] = got / (time.perf_counter() - t)
    out["claims_cpu"] = cpu.share
    with Cpu(pids) as cpu:
        t = time.perf_counter()
        list(ex.map(lambda s: once_more(s.heartbeat), sims))
        out["heartbeats_per_second"] = len(sims) / (time.perf_counter() - t)
    out["heartbeats_cpu"] = cpu.share


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=3000)
    ap.add_argument("--workers", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rp = RedisProcess(Path(tmp) / "redis").start()
        try:
            r = redis.Redis(port=rp.port)
            rows = {
                "piloop claim (Lua script)": [],
                "piloop heartbeat, 1,000 workers (Lua script)": [],
                "rq enqueue+dequeue": [],
                "piloop claim (HTTP API)": [],
                "piloop heartbeat, 1,000 workers (HTTP API, 8 threads)": [],
            }
            for _ in range(a.runs):
                rows["piloop claim (Lua script)"].append(lua_claims(r, Path(tmp), a.jobs))
                rows["piloop heartbeat, 1,000 workers (Lua script)"].append(lua_heartbeats(r, Path(tmp), a.workers, 2))
                rows["rq enqueue+dequeue"].append(rq_rate(r, a.jobs))
            claims, beats = http_rates(rp, a.jobs, a.workers)
            rows["piloop claim (HTTP API)"].append(claims)
            rows["piloop heartbeat, 1,000 workers (HTTP API, 8 threads)"].append(beats)
        finally:
            rp.stop()
    rq = statistics.median(rows["rq enqueue+dequeue"])
    width = max(len(k) for k in rows)
    print(f"{'what'.ljust(width)}  {'per second':>10}  {'× rq':>6}")
    for k, v in rows.items():
        m = statistics.median(v)
        print(f"{k.ljust(width)}  {m:10.0f}  {m / rq:6.2f}")
    print(
        f"({a.jobs} jobs, {a.workers} workers, median of {a.runs} runs for the Lua and rq rows; one machine, one Redis)"
    )


if __name__ == "__main__":
    main()
