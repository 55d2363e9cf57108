"""Jobs end to end: drain throughput and start latency of piloop, rq and Celery, on one Redis.

    python bench/jobs.py [--jobs 2000] [--latency 200] [--only piloop|rq|celery]   (or `python -m bench` for all)

Drain: `jobs` no-op jobs are queued first, then two workers start and drain them; the time runs from the workers'
spawn to the last job's end (so each side pays its workers' start-up once).
  piloop        `piloop serve --listen 127.0.0.1:<port>` (its `serve` worker given no slots) and two remote
                `piloop worker --pool bench` over loopback TCP, 8 evaluation slots each, production timings (renew
                10 s). A process job runs `/bin/true` under its own self-fencing shim; a task job (runner `task`)
                runs `bench.noop:noop` in a process forked from the shim (its args and result through the CAS).
  rq            two `rq worker --burst`: `Worker` forks a work horse per job, `SimpleWorker` runs it in-process.
  Celery        prefork: one `celery worker --concurrency 2`; solo: two `celery worker --pool solo`. Redis
                broker, no result backend (a finished task INCRs a counter, so the bench knows when all are done).
Like with like: the peers' "subprocess" task runs `/bin/true` with `subprocess.run` (what a piloop process job
does), their "Python" task is a plain function call (what a piloop task is, minus its own process).
Start latency: one job at a time on idle workers, from just before the submit call to the job's first line writing
the wall time to a file; median and p99.
RSS: a worker's long-lived processes (piloop: the worker and its shim host; rq: the worker; Celery: the main
process and its pool), at rest (idle, after the latency warm-up) and the most seen while draining.
CPU a job of a drain: the server, the workers' long-lived processes with what they reaped, Redis and the whole
machine; piloop's also by process (`piloop_cpu`: the worker, its shim host, the shims, the jobs' processes), a peer's
jobs' processes apart (what its workers reaped).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402
import redis  # noqa: E402

from piloop_common.cas.address import hash_bytes  # noqa: E402
from piloop_server.state.keys import Keys  # noqa: E402
from piloop_server.tokens import TokenStore  # noqa: E402
from tests.helpers.redis import RedisProcess, free_port  # noqa: E402
from tests.helpers.serve import Daemon, cli_env, short_home  # noqa: E402

BIN = Path(sys.executable).parent
MiB = 1 << 20


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def wait_until(
    cond: Callable[[], Any], timeout: float, what: str, every: float = 0.05, report: Callable[[], None] | None = None
) -> Any:
    end = time.monotonic() + timeout
    last = time.monotonic()
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        if report and time.monotonic() - last > 10:
            last = time.monotonic()
            report()
        time.sleep(every)
    raise SystemExit(f"bench: timed out after {timeout}s waiting for {what}")


def stamp_time(path: Path) -> float | None:
    try:
        return float(path.read_text())
    except (OSError, ValueError):
        return None


def quantile(xs: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) by the nearest rank: p99 of 200 samples is the second largest."""
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * len(s)) - 1))]


@dataclass
class Drain:
    jobs: int
    seconds: float
    not_succeeded: int = 0
    worker_rss_mib: float = 0.0  # the most one worker's long-lived processes held while draining
    server_rss_mib: float = 0.0
    # CPU ms per job: the server, the workers' long-lived processes (with the children they reaped), Redis, and the
    # whole machine (busy time of all CPUs: it includes what the others sharing the box ran meanwhile)
    cpu_ms: dict[str, float] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.jobs / self.seconds


@dataclass
class Latency:
    samples: list[float] = field(default_factory=list)  # seconds
    worker_rss_mib: float = 0.0  # idle, after the warm-up job

    @property
    def median_ms(self) -> float:
        return statistics.median(self.samples) * 1000

    @property
    def p99_ms(self) -> float:
        return quantile(self.samples, 0.99) * 1000


class RssWatch:
    """The largest RSS (MiB) seen of each group of processes, sampled every 0.1 s on a thread. A group is its
    processes and, where `children`, the children each has when sampled (a shim host, a prefork pool)."""

    def __init__(self, groups: dict[str, list[int]], children: bool = True) -> None:
        self.groups = {k: [psutil.Process(p) for p in pids] for k, pids in groups.items()}
        self.children = children
        self.peak = {k: 0.0 for k in groups}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while True:
            for k, procs in self.groups.items():
                self.peak[k] = max(self.peak[k], rss_mib(with_children(procs) if self.children else procs))
            if self.stop.wait(0.1):
                return

    def __enter__(self) -> RssWatch:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


class CpuWatch:
    """CPU seconds of groups of processes (with the children each has reaped) and of the machine, start to stop.
    With `reaped`, what that group's processes reaped (the processes its jobs ran in) is also told apart, as `jobs`."""

    def __init__(self, groups: dict[str, list[int]], reaped: str | None = None) -> None:
        self.groups = {k: [psutil.Process(p) for p in pids] for k, pids in groups.items()}
        self.reaped = reaped
        self.start = self._now()

    def _now(self) -> dict[str, float]:
        out = {}
        for k, procs in self.groups.items():
            total = 0.0
            for p in with_children(procs):
                try:
                    t = p.cpu_times()
                    total += t.user + t.system + t.children_user + t.children_system
                    if k == self.reaped:
                        out["jobs"] = out.get("jobs", 0.0) + t.children_user + t.children_system
                except psutil.Error:
                    pass
            out[k] = total
        if self.reaped is not None:
            out.setdefault("jobs", 0.0)
        m = psutil.cpu_times()
        out["machine"] = m.user + m.system + m.nice + getattr(m, "irq", 0) + getattr(m, "softirq", 0)
        return out

    def per_job_ms(self, n: int) -> dict[str, float]:
        now = self._now()
        return {k: (now[k] - self.start[k]) * 1000 / n for k in now}


def piloop_cpu(worker_pids: Sequence[int]) -> dict[str, float]:
    """CPU seconds of piloop workers' processes by kind, each since its birth: the workers' own (`worker`), their shim
    hosts' with the shims they reaped (`shim host`), the shims' own (`shims`), and what the shims reaped: the
    processes the jobs ran in (`jobs`), with the warm task processes the shims still have. A shim `setsid()`s but
    stays its host's child, so it is found there."""
    out = dict.fromkeys(("worker", "shim host", "shims", "jobs"), 0.0)
    for pid in worker_pids:
        try:
            worker = psutil.Process(pid)
            t = worker.cpu_times()
            out["worker"] += t.user + t.system
            for host_pid in child_pids(worker):
                host = psutil.Process(host_pid)
                t = host.cpu_times()
                out["shim host"] += t.user + t.system + t.children_user + t.children_system
                for shim_pid in child_pids(host):
                    shim = psutil.Process(shim_pid)
                    t = shim.cpu_times()
                    out["shims"] += t.user + t.system
                    out["jobs"] += t.children_user + t.children_system
                    for job_pid in child_pids(shim):  # a warm task process (piloop_worker/warm.py), alive
                        t = psutil.Process(job_pid).cpu_times()
                        out["jobs"] += t.user + t.system
        except psutil.Error:
            continue
    return out


def with_children(procs: Sequence[psutil.Process]) -> list[psutil.Process]:
    out = list(procs)
    for p in procs:
        for c in child_pids(p):
            try:
                out.append(psutil.Process(c))
            except psutil.Error:
                pass
    return out


def child_pids(p: psutil.Process) -> list[int]:
    """`p`'s children from `/proc/PID/task/*/children`: psutil's `children()` reads every process's stat in /proc,
    which 10 times a second for three groups took ~12 % of a CPU from the drains it measures."""
    try:
        tids = os.listdir(f"/proc/{p.pid}/task")
    except OSError:
        return []
    out: list[int] = []
    for tid in tids:
        try:
            with open(f"/proc/{p.pid}/task/{tid}/children") as f:
                out += [int(x) for x in f.read().split()]
        except FileNotFoundError:  # a kernel without CONFIG_PROC_CHILDREN (or the thread ended): ask psutil
            if not os.path.exists(f"/proc/{p.pid}/task/{tid}"):
                continue
            try:
                return [c.pid for c in p.children(recursive=False)]
            except psutil.Error:
                return []
        except OSError:
            continue
    return out


def rss_mib(procs: Sequence[psutil.Process]) -> float:
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total / MiB


def long_lived(pid: int) -> list[int]:
    """A worker's process and the children it has at rest (a shim host, a prefork pool)."""
    try:
        p = psutil.Process(pid)
        return [pid, *(c.pid for c in p.children(recursive=False))]
    except psutil.Error:
        return [pid]


def stop_procs(procs: Sequence[subprocess.Popen], group: bool = False) -> None:
    for p in procs:
        if p.poll() is None:
            if group:
                os.killpg(p.pid, signal.SIGTERM)
            else:
                p.terminate()
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            if group:
                os.killpg(p.pid, signal.SIGKILL)
            else:
                p.kill()
            p.wait(10)


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

    def __init__(self, rp: RedisProcess, slots: int = 8, profile: Path | None = None, executor: str = "") -> None:
        self.ns = "bj" + uuid.uuid4().hex[:8]
        self.slots, self.profile = slots, profile
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

    def spawn_workers(self, n: int = 2, task_processes: str = "warm") -> list[subprocess.Popen]:
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
            if self.profile is not None and os.environ.get("BENCH_PROFILE") != "server":
                profiler = os.environ.get(
                    "BENCH_WORKER_PROFILER", "cprofile"
                )  # yappi: every thread, not the loop's only
                cmd = [str(ROOT / "bench" / "profiled.py"), profiler, str(self.profile / f"worker-{i}.prof"), *cmd]
            procs.append(
                subprocess.Popen(
                    [sys.executable, *cmd],
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

    def args_blob(self, api, args: list[Any]) -> str:
        data = json.dumps({"args": args, "kwargs": {}}).encode()
        address = hash_bytes(data)
        api.call_bytes("PUT", f"/v1/cas/blobs/{address}", content=data)
        return address

    def spec(self, api, what: str, stamp: Path | None = None) -> dict[str, Any]:
        if what == "task":
            args = [str(stamp)] if stamp else []
            return {
                "runner": "task",
                "argv": ["bench.noop:stamp" if stamp else "bench.noop:noop"],
                "inputs": {"args.json": self.args_blob(api, args)},
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


# -- rq -------------------------------------------------------------------------------------

RQ_CLASSES = {"Worker": "rq.worker.Worker", "SimpleWorker": "rq.worker.SimpleWorker"}
PY_JOB = {"python": "noop", "subprocess": "run_true"}


def _rq_worker(
    rp: RedisProcess, queue: str, cls: str, burst: bool, tmp: Path, session: bool = False
) -> subprocess.Popen:
    """An `rq worker`; with `session`, in a session of its own (killed with its work horse as one group)."""
    args = [str(BIN / "rq"), "worker", "--url", rp.url, "--quiet", "--worker-class", RQ_CLASSES[cls]]
    return subprocess.Popen(
        args + (["--burst"] if burst else []) + [queue],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=tmp,
        start_new_session=session,
    )


def rq_drain(rp: RedisProcess, n: int, cls: str, job: str, tmp: Path) -> Drain:
    from rq import Queue

    from bench import noop

    r = redis.Redis.from_url(rp.url)
    q = Queue("rq" + uuid.uuid4().hex[:8], connection=r)
    fn = getattr(noop, PY_JOB[job])
    for _ in range(n):
        q.enqueue(fn)
    t0 = time.perf_counter()
    procs = [_rq_worker(rp, q.name, cls, True, tmp) for _ in range(2)]
    cpu = CpuWatch(
        {"workers": [p.pid for p in procs], "redis": [rp.proc.pid]},  # type: ignore[union-attr]
        reaped="workers",
    )
    last = cpu.start
    with RssWatch({f"w{i}": [p.pid] for i, p in enumerate(procs)}, children=False) as watch:  # not its horses

        def done() -> bool:
            nonlocal last
            if all(p.poll() is not None for p in procs):
                return True
            last = cpu._now()  # a burst worker's CPU can only be read while it lives
            # the last job's end, not the burst workers' exit, which at times lingers a minute past it
            return q.finished_job_registry.count + q.failed_job_registry.count >= n

        wait_until(done, 3600, "rq to drain", every=0.01, report=lambda: say(f"rq {cls} {job}: {n - len(q)} taken"))
        seconds = time.perf_counter() - t0
    stop_procs(procs)
    cpu_ms = {k: (last[k] - cpu.start[k]) * 1000 / n for k in last}
    bad = q.failed_job_registry.count
    d = Drain(n, seconds, bad, max(watch.peak.values()), cpu_ms=cpu_ms)
    say(f"rq {cls} {job}: {d.rate:.1f} jobs/s")
    r.close()
    return d


def rq_latency(rp: RedisProcess, k: int, gap: float, cls: str, tmp: Path) -> Latency:
    from rq import Queue

    from bench.noop import stamp

    r = redis.Redis.from_url(rp.url)
    q = Queue("rq" + uuid.uuid4().hex[:8], connection=r)
    procs = [_rq_worker(rp, q.name, cls, False, tmp) for _ in range(2)]
    out = Latency()
    try:
        for i in range(-1, k):  # -1: the warm-up job, which waits for the workers to be up
            time.sleep(gap)
            mark = tmp / f"rq-{cls}-{i}-{uuid.uuid4().hex[:6]}"
            t = time.time()
            q.enqueue(stamp, str(mark))
            started = wait_until(lambda mark=mark: stamp_time(mark), 60, "an rq job to start", every=0.001)
            if i >= 0:
                out.samples.append(started - t)
        time.sleep(gap)
        out.worker_rss_mib = max(rss_mib([psutil.Process(p.pid)]) for p in procs)
        say(f"rq {cls}: start latency median {out.median_ms:.0f} ms, p99 {out.p99_ms:.0f} ms")
    finally:
        stop_procs(procs)
        r.close()
    return out


# -- Celery ---------------------------------------------------------------------------------

CELERY_TASK = {"python": "bench.noop", "subprocess": "bench.true"}


def _celery_workers(
    rp: RedisProcess,
    queue: str,
    pool: str,
    tmp: Path,
    backend: str | None = None,
    env: dict[str, str] | None = None,
    count: int = 2,
    first: int = 0,
) -> list[subprocess.Popen]:
    """Celery workers of `bench.tasks` on `queue` (prefork: one of concurrency 2; solo: `count`, named from `first`
    on); with `backend` (a Redis URL), results stored there; `env`: more of bench/tasks.py's settings."""
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "PILOOP_BENCH_BROKER": rp.url,
        "PILOOP_BENCH_QUEUE": queue,
        **(env or {}),
    }
    if backend:
        env["PILOOP_BENCH_BACKEND"] = backend
    base = [
        str(BIN / "celery"),
        "-A",
        "bench.tasks",
        "worker",
        "--loglevel",
        "WARNING",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
    ]
    shapes = [["--pool", "prefork", "--concurrency", "2"]] if pool == "prefork" else [["--pool", "solo"]] * count
    return [
        subprocess.Popen(
            base + shape + ["-n", f"w{first + i}-{queue}@%h"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=tmp,
            start_new_session=True,
        )
        for i, shape in enumerate(shapes)
    ]


def _celery_client(rp: RedisProcess, queue: str):
    from celery import Celery

    app = Celery("bench-client", broker=rp.url)
    app.conf.update(task_default_queue=queue, task_ignore_result=True)
    return app


def celery_drain(rp: RedisProcess, n: int, pool: str, job: str, tmp: Path) -> Drain:
    queue = "cq" + uuid.uuid4().hex[:8]
    app = _celery_client(rp, queue)
    with app.producer_or_acquire() as producer:
        for _ in range(n):
            app.send_task(CELERY_TASK[job], queue=queue, producer=producer)
    r = redis.Redis.from_url(rp.url)
    t0 = time.perf_counter()
    procs = _celery_workers(rp, queue, pool, tmp)
    try:
        cpu = CpuWatch(
            {"workers": [p.pid for p in procs], "redis": [rp.proc.pid]},  # type: ignore[union-attr]
            reaped="workers",
        )
        with RssWatch({f"w{i}": [p.pid] for i, p in enumerate(procs)}) as watch:
            done = lambda: int(r.get(f"{queue}:done") or 0)  # noqa: E731
            wait_until(
                lambda: done() >= n,
                3600,
                "Celery to drain",
                every=0.01,
                report=lambda: say(f"celery {pool} {job}: {done()}/{n} done"),
            )
            seconds = time.perf_counter() - t0
            cpu_ms = cpu.per_job_ms(n)
    finally:
        stop_procs(procs, group=True)
        r.close()
        app.close()
    d = Drain(n, seconds, 0, max(watch.peak.values()), cpu_ms=cpu_ms)
    say(f"celery {pool} {job}: {d.rate:.1f} jobs/s")
    return d


def celery_latency(rp: RedisProcess, k: int, gap: float, pool: str, tmp: Path) -> Latency:
    queue = "cq" + uuid.uuid4().hex[:8]
    app = _celery_client(rp, queue)
    procs = _celery_workers(rp, queue, pool, tmp)
    out = Latency()
    try:
        with app.producer_or_acquire() as producer:
            for i in range(-1, k):  # -1: the warm-up job, which waits for the workers to be up
                time.sleep(gap)
                mark = tmp / f"celery-{pool}-{i}-{uuid.uuid4().hex[:6]}"
                t = time.time()
                app.send_task("bench.stamp", (str(mark),), queue=queue, producer=producer)
                started = wait_until(lambda mark=mark: stamp_time(mark), 60, "a Celery job to start", every=0.001)
                if i >= 0:
                    out.samples.append(started - t)
        time.sleep(gap)
        out.worker_rss_mib = max(rss_mib([psutil.Process(p) for p in long_lived(w.pid)]) for w in procs)
        say(f"celery {pool}: start latency median {out.median_ms:.0f} ms, p99 {out.p99_ms:.0f} ms")
    finally:
        stop_procs(procs, group=True)
        app.close()
    return out


def main() -> None:
    import argparse
    import tempfile

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--latency", type=int, default=200, help="jobs for the start latency median and p99")
    ap.add_argument("--gap", type=float, default=0.2, help="idle seconds before each latency job")
    ap.add_argument("--only", choices=["piloop", "rq", "celery"], action="append")
    a = ap.parse_args()
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
