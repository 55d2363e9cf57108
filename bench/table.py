"""The table of `python -m bench`: a row per figure, piloop beside each peer, the best peer and the ratio.

Each part's rows are built here from its results (`rows`); the new parts' modules (recovery, depth, bytes,
heartbeats, clone) each give their own rows through `row`.
"""

from __future__ import annotations

import os
from typing import Any

from bench import clone, depth, heartbeats, job_bytes, recovery
from bench.measure import Latency
from bench.peers import PY_JOB

MiB = 1 << 20
PEERS = ("rq Worker", "rq SimpleWorker", "Celery prefork", "Celery solo")
# the parts whose module builds its own rows
OWN_ROWS = {"recovery": recovery, "depth": depth, "bytes": job_bytes, "heartbeats": heartbeats, "clone": clone}


def _median_ms(d: dict[str, Any]) -> float:
    return Latency(d["samples"]).median_ms


def _p99_ms(d: dict[str, Any]) -> float:
    return Latency(d["samples"]).p99_ms


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
            ("task", "python", "Python no-op", "piloop: warm task processes (the default)"),
            ("task fresh", "python", "Python no-op, a fork each", "piloop: processes = fresh, a fork per task"),
        ):
            if f"piloop {what}" not in j:  # a run from before this drain existed (its rounds lack it too)
                continue
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
            f"CAS 1 × {c['large_bytes'] // MiB} MiB put+get: peak RSS of the process streaming it, s3 store",
            "MiB",
            "lower",
            big["s3 (moto)"]["rss_peak_mib"],
            other=("boto3", big["boto3 (moto)"]["rss_peak_mib"]),
            note=f"the blob is {c['large_bytes'] // MiB} MiB; put and get stream it in chunks",
        )
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
                note="piloop: worker + slot supervisors; Celery prefork: main + pool",
            )
        if j:
            load = {p: max(j[f"{p} {x}"]["worker_rss_mib"] for x in PY_JOB) for p in PEERS if f"{p} python" in j}
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
    for name, module in OWN_ROWS.items():
        if res.get(name):
            module.rows(res[name], row)
    return out


PILOOP_PARTS = (
    ("worker", "worker"),
    ("supervisors", "supervisors"),
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
