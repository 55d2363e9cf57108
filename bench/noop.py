"""The jobs every side of the benchmarks runs, in a module light enough to import per job (rq's work horse
imports a job's function anew each time; a slot's warm task process imports a piloop task's module once).

    noop       a plain Python no-op
    run_true   the same subprocess a piloop process job runs: /bin/true
    stamp      write the wall time to `path` (atomically): when a job's first line ran
    marked     a job that appends `start`, a `tick` every 50 ms, then `end` to a marker file (the recovery bench)
"""

from __future__ import annotations

import os
import subprocess
import time

TRUE = "/bin/true"


def noop() -> None:
    return None


def run_true() -> None:
    subprocess.run([TRUE], check=True)


def stamp(path: str) -> None:
    t = repr(time.time())
    with open(path + ".tmp", "w") as f:
        f.write(t)
    os.replace(path + ".tmp", path)


def marked(path: str, job: str, seconds: float) -> None:
    """Lines `<event> <job> <where> <run> <pgid> <time>` appended to `path`, the format of tests/helpers/workers.py's
    marker job (its `marker_runs` reads both): `start`, a `tick` every 50 ms, `end`. The job's first run (no line of
    `job` in the file yet) runs until it is killed; a later one `seconds`."""
    first = not (os.path.exists(path) and f" {job} " in open(path).read())

    def line(ev: str) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(fd, f"{ev} {job} pid{os.getppid()} {os.getpid()} {os.getpgid(0)} {time.time():.3f}\n".encode())
        os.close(fd)

    line("start")
    end = time.time() + (10_000 if first else seconds)
    while time.time() < end:
        time.sleep(0.05)
        line("tick")
    line("end")
