"""The jobs every side of the benchmarks runs, in a module light enough to import per job (rq's work horse
imports a job's function anew each time; the shim host imports a piloop task's module once).

    noop       a plain Python no-op
    run_true   the same subprocess a piloop process job runs: /bin/true
    stamp      write the wall time to `path` (atomically): when a job's first line ran
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
