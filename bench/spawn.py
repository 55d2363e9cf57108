"""CPU a spawn of `/bin/true` costs, by method: piloop_worker.spawn's C extension and its subprocess fallback (each
in its own process group, the parent-death signal armed and checked), beside a plain `Popen` (no parent-death
signal) and `Popen` of `setpriv --pdeathsig KILL` (the shim's way).

    python -m bench.spawn [--spawns 500] [--rounds 5]

CPU time (this process's and its reaped children's, user + system), not wall time: a figure that a loaded machine
moves less. Each round runs every method once, in an order that alternates; a figure is the median of the rounds.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import signal
import statistics
import subprocess
import time
from collections.abc import Callable

from piloop_worker import spawn

ENV = {"PATH": "/usr/bin:/bin"}


def _cpu() -> float:
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def methods(devnull: int) -> dict[str, Callable[[], None]]:
    def by(impl: str) -> Callable[[], None]:
        fn = spawn.IMPLEMENTATIONS[impl]

        def run() -> None:
            pid = fn(["true"], env=ENV, stdin=devnull, stdout=devnull, stderr=devnull, pdeathsig=signal.SIGKILL)
            os.waitpid(pid, 0)

        return run

    def popen(*prefix: str) -> Callable[[], None]:
        def run() -> None:
            subprocess.Popen(
                [*prefix, "/bin/true"], env=ENV, stdin=devnull, stdout=devnull, stderr=devnull, process_group=0
            ).wait()

        return run

    out = {f"piloop_worker.spawn, {impl}": by(impl) for impl in ("c", "python") if impl in spawn.IMPLEMENTATIONS}
    out["Popen, no parent-death signal"] = popen()
    if (setpriv := shutil.which("setpriv")) is not None:
        out["Popen of setpriv --pdeathsig KILL"] = popen(setpriv, "--pdeathsig", "KILL", "--")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.spawn", description=__doc__.split("\n\n")[0])
    ap.add_argument("--spawns", type=int, default=500, help="spawns a method a round")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    runs = methods(devnull)
    cpu: dict[str, list[float]] = {name: [] for name in runs}
    wall: dict[str, list[float]] = {name: [] for name in runs}
    for r in range(args.rounds):
        for name, fn in runs.items() if r % 2 == 0 else reversed(runs.items()):
            c0, t0 = _cpu(), time.perf_counter()
            for _ in range(args.spawns):
                fn()
            cpu[name].append((_cpu() - c0) * 1000 / args.spawns)
            wall[name].append((time.perf_counter() - t0) * 1000 / args.spawns)
    load = os.getloadavg()[0]
    print(f"CPU a spawn of /bin/true, median of {args.rounds} rounds of {args.spawns} (load {load:.1f})\n")
    print("| method | CPU ms | rounds' CPU ms | wall ms |")
    print("| - | -: | - | -: |")
    for name in runs:
        each = ", ".join(f"{x:.2f}" for x in cpu[name])
        print(f"| {name} | {statistics.median(cpu[name]):.2f} | {each} | {statistics.median(wall[name]):.2f} |")


if __name__ == "__main__":
    main()
