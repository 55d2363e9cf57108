"""System calls a job costs, by process: one piloop worker drains no-op jobs under `strace -f`.

    python -m bench.syscalls [--jobs 300] [--what task|process] [--out FILE]

The worker (8 evaluation slots, production timings) starts under `strace -f -Y` once the jobs are queued, so the
trace holds its start-up, every job and its stop: the figures are per job over the whole drain, the start-up spread
over `--jobs`. Each traced line is put to a process by its command name (`-Y`, what `prctl(PR_SET_NAME)` set):

  worker       `piloop-worker` and its threads (heartbeat, relay)
  supervisors  what supervises the jobs: the shim host and the shims (`piloop-shim*`), or the slot supervisors
               (`piloop-slot*`)
  tasks        a Python task's own process (`piloop-task*`; where none renamed itself, counted with its parent's name)
  jobs         everything else: a process job's command, a process before its exec

strace slows each traced call many times over: the counts are the figure, never the time. docs/performance.md
holds the table before and after the slot supervisor (issue 50).
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.jobs import PiloopSide
from bench.measure import say, stop_procs, wait_until
from tests.helpers.redis import RedisProcess

ROLES = ("worker", "supervisors", "tasks", "jobs")
LINE = re.compile(r"^(\d+)<([^>]*)> (?:<\.\.\. )?([a-z0-9_]+)(\(| resumed>)")


def role_of(comm: str) -> str:
    if comm.startswith("piloop-worker"):
        return "worker"
    if comm.startswith(("piloop-shim", "piloop-slot")):
        return "supervisors"
    if comm.startswith("piloop-task"):
        return "tasks"
    return "jobs"


def count(trace: Path) -> dict[str, collections.Counter[str]]:
    """Calls by role and name; a call strace split into `unfinished ...` and `<... resumed>` counts once."""
    by: dict[str, collections.Counter[str]] = {r: collections.Counter() for r in ROLES}
    with open(trace, errors="replace") as f:
        for line in f:
            m = LINE.match(line)
            if m is None or m.group(4) == " resumed>":
                continue  # a signal, an exit, or the second half of a call counted at its first
            by[role_of(m.group(2))][m.group(3)] += 1
    return by


def measure(n: int, what: str) -> dict[str, Any]:
    if shutil.which("strace") is None:
        raise SystemExit("bench.syscalls: strace is not installed (apt-get install strace)")
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        rp = RedisProcess(tmp / "redis").start()
        side = PiloopSide(rp).start()
        try:
            with side.api() as api:
                spec = side.spec(api, what)
                for _ in range(n):
                    api.call("POST", "/v1/jobs", {"pool": "bench", "spec": spec})
            trace = tmp / "trace"
            t0 = time.perf_counter()
            (proc,) = side.spawn_workers(1, wrap=["strace", "-f", "-Y", "-qq", "-o", str(trace)])
            try:
                wait_until(lambda: side.left() == 0, 3600, f"{n} {what} jobs to drain under strace", every=0.1)
            finally:
                stop_procs([proc], group=True)
            say(f"{n} {what} jobs drained under strace in {time.perf_counter() - t0:.0f}s")
            by = count(trace)
        finally:
            side.close()
            rp.stop()
    per_job = {r: round(sum(c.values()) / n, 1) for r, c in by.items()}
    return {
        "jobs": n,
        "what": what,
        "per_job": per_job | {"total": round(sum(per_job.values()), 1)},
        "top": {r: [(name, round(k / n, 2)) for name, k in c.most_common(8)] for r, c in by.items()},
    }


def show(got: dict[str, Any]) -> str:
    out = [f"system calls a {got['what']} job, one worker draining {got['jobs']}:"]
    for r in (*ROLES, "total"):
        top = ", ".join(f"{name} {k:g}" for name, k in got["top"].get(r, [])[:6])
        out.append(f"  {r:<12} {got['per_job'][r]:>7.1f}   {top}")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=300)
    ap.add_argument("--what", choices=["task", "process"], default="task")
    ap.add_argument("--out", type=Path, help="the figures as JSON, written here too")
    a = ap.parse_args()
    got = measure(a.jobs, a.what)
    print(show(got))
    if a.out is not None:
        a.out.write_text(json.dumps(got, indent=1))


if __name__ == "__main__":
    main()
