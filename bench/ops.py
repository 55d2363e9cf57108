"""What one call of each kind costs the server and Redis: the figures behind docs/scale.md.

    python -m bench.ops [--calls N] [--json]

One `piloop serve` on a redis-server of its own, one simulated worker over HTTP (tests/helpers/simworker.py), calls
made one at a time so that each is measured alone: N submits (through the socket, as the CLI does), N claims of one
job each, N log appends of one chunk each, N reports, N heartbeats of a worker that holds 8 leases. For each, the
server's CPU (the `piloop serve` process) and Redis's (the redis-server process) per call, the commands Redis ran per
call (`INFO commandstats`: a script once, and each command it calls), the bytes of Redis memory a call left, and the
call's latency as the caller saw it. A real worker batches: its reports go several to a call with the next claim
(`/v1/worker/reports`), so these single calls are the dear end.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil
import redis

from bench.claims import SERVER_CONFIG
from piloop_common.cas.local import LocalStore
from piloop_common.cli.output import table
from piloop_common.protocol.worker import PROTOCOL
from piloop_common.sdk.client import ApiClient
from piloop_server.state.keys import Keys
from piloop_server.tokens import TokenStore
from tests.helpers.redis import RedisProcess, free_port
from tests.helpers.serve import Daemon, short_home
from tests.helpers.simworker import SimWorker

HELD = 8  # leases the heartbeating worker holds: a worker of 8 slots, full


@dataclass
class OpCost:
    name: str
    calls: int
    server_cpu_ms: float  # the server process's CPU a call
    redis_cpu_ms: float  # the redis-server process's CPU a call (its event loop, parsing, replies, AOF)
    redis_commands: float  # commands a call: a script once, and each command it calls
    redis_bytes: float  # used_memory a call left behind
    p50_ms: float
    p99_ms: float


class Meter:
    """CPU of the server and Redis, and Redis's own command counters, across a block of calls."""

    def __init__(self, server_pid: int, rp: RedisProcess, r: redis.Redis) -> None:
        self.server, self.redis, self.r = psutil.Process(server_pid), psutil.Process(rp.proc.pid), r  # type: ignore[union-attr]

    def snapshot(self) -> tuple[float, float, int, int]:
        calls = sum(int(v["calls"]) for v in self.r.info("commandstats").values())
        used = int(self.r.info("memory")["used_memory"])
        return sum(self.server.cpu_times()[:2]), sum(self.redis.cpu_times()[:2]), calls, used

    def measure(self, name: str, calls: list[Callable[[], object]]) -> OpCost:
        took: list[float] = []
        before = self.snapshot()
        for call in calls:
            t = time.perf_counter()
            call()
            took.append(time.perf_counter() - t)
        after = self.snapshot()
        n = len(calls)
        # the two INFO calls of each snapshot are Redis's too: a few of its commands, not a call's
        d = [a - b for a, b in zip(after, before, strict=True)]
        took.sort()
        return OpCost(
            name=name,
            calls=n,
            server_cpu_ms=1000 * d[0] / n,
            redis_cpu_ms=1000 * d[1] / n,
            redis_commands=max(d[2] - 3, 0) / n,
            redis_bytes=d[3] / n,
            p50_ms=1000 * statistics.median(took),
            p99_ms=1000 * took[min(n - 1, int(0.99 * n))],
        )


def run(calls: int) -> list[OpCost]:
    with tempfile.TemporaryDirectory() as tmp:
        rp = RedisProcess(Path(tmp) / "redis").start()
        ns = "o" + uuid.uuid4().hex[:8]
        d = Daemon(short_home("ops"), config=SERVER_CONFIG, redis_url=rp.url, namespace=ns)
        port = free_port()
        d.start(listen=f"127.0.0.1:{port}")
        r = redis.Redis.from_url(rp.url)
        try:
            return _measure_all(d, rp, r, ns, port, calls)
        finally:
            r.close()
            d.cleanup()
            rp.stop()


def _measure_all(d: Daemon, rp: RedisProcess, r: redis.Redis, ns: str, port: int, n: int) -> list[OpCost]:
    tokens = TokenStore(r, Keys(ns))
    url = f"http://127.0.0.1:{port}"
    meter = Meter(d.proc.pid, rp, r)  # type: ignore[union-attr]
    out = []
    with d.api() as op:
        cas_id = op.call("GET", "/v1/status")["cas"]["id"]
        spec = {"pool": "bench", "kind": "evaluation", "spec": {"argv": ["true"]}}
        out.append(meter.measure("submit (socket)", [lambda: op.call("POST", "/v1/jobs", spec)] * n))
    w = SimWorker(ApiClient(url=url, token=tokens.create("ops", by="human:bench")), "bench", cas_id)
    w.register()
    out.append(meter.measure("claim (one job)", [lambda: w.claim(evaluation=1)] * n))
    chunk = LocalStore(d.home / "cas").put_bytes(b"a line of the job's log\n")
    held = list(w.held.items())

    def log(job: str, token: str) -> Callable[[], object]:
        body = {"protocol": PROTOCOL, "job": job, "token": token, "chunks": [chunk]}
        return lambda: w.api.call("POST", "/v1/worker/log", body)

    out.append(meter.measure("log append (one chunk)", [log(j, t) for j, t in held]))
    out.append(meter.measure("report (one job)", [lambda j=j: w.report(j, log=[chunk]) for j, _ in held[: n - HELD]]))
    assert len(w.held) == HELD, w.held  # the rest are held through the heartbeats
    out.append(meter.measure(f"heartbeat ({HELD} leases)", [w.heartbeat] * n))
    w.api.close()
    return out


COLUMNS = (
    ("call", "name", "{}"),
    ("server ms", "server_cpu_ms", "{:.2f}"),
    ("Redis ms", "redis_cpu_ms", "{:.3f}"),
    ("commands", "redis_commands", "{:.1f}"),
    ("bytes left", "redis_bytes", "{:,.0f}"),
    ("p50 ms", "p50_ms", "{:.2f}"),
    ("p99 ms", "p99_ms", "{:.2f}"),
)


def rows(costs: list[OpCost]) -> list[list[str]]:
    return [[fmt.format(getattr(c, key)) for _, key, fmt in COLUMNS] for c in costs]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=2000, help="calls of each kind (at least 2 × 8)")
    ap.add_argument("--json", action="store_true", help="the figures as JSON")
    a = ap.parse_args()
    if a.calls < 2 * HELD:
        ap.error(f"--calls must be at least {2 * HELD}")
    load = psutil.getloadavg()[0]
    costs = run(a.calls)
    if a.json:
        json.dump({"load1_start": load, "ops": [asdict(c) for c in costs]}, sys.stdout, indent=2)
        print()
        return
    print(table([h for h, _, _ in COLUMNS], rows(costs)))
    print(
        f"\n({a.calls} calls each, one at a time; load average {load:.1f} at the start, {psutil.getloadavg()[0]:.1f} at the end)"
    )


if __name__ == "__main__":
    main()
