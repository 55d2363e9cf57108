"""CPU a job costs through a slot supervisor (`piloop_worker.slots`), split by process: the worker's side (this
process, a `SlotHandle`), the supervisor, and the job (a `/bin/true` the supervisor reaped, or the warm task
process); and the system calls of the supervisor's side per warm task (`strace -c -f -p`).

    python -m bench.slots [--jobs 500] [--rounds 3] [--strace-tasks 200]

Each job is started, waited for (`Ended`) and acknowledged, one after another on one slot, as a worker's loop would.
CPU time (user + system, from getrusage and /proc/<pid>/stat), not wall time: a figure a loaded machine moves less.
A figure is the median of the rounds.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from piloop_worker import clock
from piloop_worker.slots import SlotDir, SlotHandle, SlotRequest
from piloop_worker.slots.wire import Ended, Started

ENV = {"PATH": "/usr/bin:/bin"}
TICK = os.sysconf("SC_CLK_TCK")
ARGS = b'{"args": [], "kwargs": {}}'


def _proc_cpu(pid: int) -> tuple[float, float]:
    """A process's own CPU seconds, and its reaped children's."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rpartition(b")")[2].split()
    except OSError:
        return 0.0, 0.0
    return (int(fields[11]) + int(fields[12])) / TICK, (int(fields[13]) + int(fields[14])) / TICK


def _memory(pid: int) -> tuple[float, float]:
    """A process's resident and proportional set sizes, in MiB (PSS: its shared pages divided among their users)."""
    found = {"Rss:": 0.0, "Pss:": 0.0}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                key, _, rest = line.partition(" ")
                if key in found:
                    found[key] = int(rest.split()[0]) / 1024
    except OSError:
        pass
    return found["Rss:"], found["Pss:"]


def _self_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def request(kind: str) -> SlotRequest:
    if kind == "true":
        return SlotRequest(argv=["/bin/true"], env=ENV, metrics_seconds=0)
    env = {**ENV, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}  # where `bench.noop` is
    return SlotRequest(argv=[], env=env, task="bench.noop:noop", args=ARGS, warm_max_tasks=100_000, metrics_seconds=0)


class Runner:
    def __init__(self, root: Path) -> None:
        self.handle = SlotHandle(SlotDir(root))
        self.handle.open()
        self.generation = 0
        self.task_pid = 0

    def run(self, req: SlotRequest) -> Ended:
        self.generation += 1
        g = self.generation
        self.handle.start(g, "job", "token", clock.now() + 600, req)
        while True:
            for msg in self.handle.read(timeout=30):
                if isinstance(msg, Started) and req.task:
                    self.task_pid = msg.pid
                elif isinstance(msg, Ended) and msg.generation == g:
                    self.handle.ack(g)
                    if msg.exit.exit_code != 0:
                        raise SystemExit(f"bench.slots: a job failed: {msg.exit}")
                    return msg

    def measure(self, kind: str, n: int) -> dict[str, float]:
        """ms of CPU a job, by process, over `n` jobs of `kind`."""
        req = request(kind)
        self.run(req)  # the warm process forked, the modules imported: not counted
        sup = self.handle.pid
        w0, (s0, c0) = _self_cpu(), _proc_cpu(sup)
        t0 = _proc_cpu(self.task_pid)[0] if req.task else 0.0
        wall = time.perf_counter()
        for _ in range(n):
            self.run(req)
        wall = time.perf_counter() - wall
        w1, (s1, c1) = _self_cpu(), _proc_cpu(sup)
        t1 = _proc_cpu(self.task_pid)[0] if req.task else 0.0
        ms = 1000 / n
        return {
            "worker": (w1 - w0) * ms,
            "supervisor": (s1 - s0) * ms,
            "job": ((c1 - c0) + (t1 - t0)) * ms,
            "wall": wall * ms,
        }

    def syscalls(self, n: int, show: bool = False) -> dict[str, float]:
        """System calls a warm task (strace -c -f -p): the supervisor's, and with its task process's."""
        req = request("task")
        self.run(req)
        return {
            "the supervisor": self._traced(n, [self.handle.pid], show),
            "the supervisor and its task process": self._traced(n, [self.handle.pid, self.task_pid], show),
        }

    def _traced(self, n: int, pids: list[int], show: bool) -> float:
        out = Path(tempfile.mkstemp(prefix="piloop-strace-")[1])
        tracer = subprocess.Popen(
            ["strace", "-c", "-f", "-o", str(out), *(a for pid in pids for a in ("-p", str(pid)))],
            stderr=subprocess.DEVNULL,
        )
        time.sleep(1.0)  # strace attached (it says nothing when it has)
        for _ in range(n):
            self.run(request("task"))
        tracer.send_signal(signal.SIGINT)
        tracer.wait(30)
        text = out.read_text()
        out.unlink()
        if show:
            print(text)
        m = re.search(r"^100\.00\s+\S+\s+\d+\s+(\d+)\s+(?:\d+\s+)?total$", text, re.M)
        if m is None:
            raise SystemExit(f"bench.slots: no total in strace's summary:\n{text}")
        return int(m.group(1)) / n

    def memory(self) -> dict[str, tuple[float, float]]:
        """RSS and PSS (MiB) of the supervisor and of its warm task process, as they are now."""
        return {"supervisor": _memory(self.handle.pid), "warm task process": _memory(self.task_pid)}

    def close(self) -> None:
        pid = self.handle.pid
        self.handle.bye()
        self.handle.close()
        end = time.monotonic() + 10
        while time.monotonic() < end and os.path.exists(f"/proc/{pid}"):
            time.sleep(0.05)


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.slots", description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=500, help="jobs of each kind a round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--strace-tasks", type=int, default=200, help="tasks traced (0: none)")
    ap.add_argument("--show-strace", action="store_true", help="print strace's tables too")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="piloop-bench-slots-") as tmp:
        runner = Runner(Path(tmp) / "slots" / "0")
        try:
            rows: dict[str, list[dict[str, float]]] = {"true": [], "task": []}
            for r in range(args.rounds):
                for kind in ("true", "task") if r % 2 == 0 else ("task", "true"):
                    rows[kind].append(runner.measure(kind, args.jobs))
            runner.run(request("task"))  # the warm process last: its memory is what a slot of tasks holds
            memory = runner.memory()
            calls = (
                runner.syscalls(args.strace_tasks, args.show_strace)
                if args.strace_tasks and shutil.which("strace")
                else None
            )
        finally:
            runner.close()
    load = os.getloadavg()[0]
    print(f"CPU ms a job through a slot supervisor, median of {args.rounds} rounds of {args.jobs} (load {load:.1f})\n")
    print("| job | worker side | supervisor | job's process | total | rounds' totals | wall ms |")
    print("| - | -: | -: | -: | -: | - | -: |")
    names = {"true": "`/bin/true` process job", "task": "warm no-op task"}
    for kind, runs in rows.items():
        med = {k: statistics.median(x[k] for x in runs) for k in runs[0]}
        totals = ", ".join(f"{x['worker'] + x['supervisor'] + x['job']:.2f}" for x in runs)
        total = med["worker"] + med["supervisor"] + med["job"]
        print(
            f"| {names[kind]} | {med['worker']:.2f} | {med['supervisor']:.2f} | {med['job']:.2f} | {total:.2f} "
            f"| {totals} | {med['wall']:.2f} |"
        )
    print()
    for who, (rss, pss) in memory.items():
        print(f"memory of the {who}: RSS {rss:.1f} MiB, PSS {pss:.1f} MiB")
    if calls is not None:
        print()
        for who, per in calls.items():
            print(f"system calls a warm task, {who} (strace -c -f, {args.strace_tasks} tasks): {per:.1f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
