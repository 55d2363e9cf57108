"""Tasks for the warm task process tests (tests/integration/test_warm_tasks.py, tests/faults/test_warm_fencing.py)."""

from __future__ import annotations

import os
import subprocess
import time

from piloop_common.tasks import task
from tests.helpers.jobwhere import worker_name

CALLS = 0  # module state, which a warm process keeps from one task to the next (as Celery's prefork children do)
HELD: list[bytes] = []


@task
def where():
    """The task's process, its group, its dir, its job, and how many tasks this process has run."""
    global CALLS
    CALLS += 1
    return {
        "pid": os.getpid(),
        "pgid": os.getpgid(0),
        "cwd": os.getcwd(),
        "dir": os.environ.get("PILOOP_JOB_DIR", ""),
        "job": os.environ.get("PILOOP_JOB", ""),
        "calls": CALLS,
    }


@task
def set_env(name, value):
    os.environ[name] = value
    return os.getpid()


@task
def get_env(name):
    return os.environ.get(name)


@task
def die(code):
    os._exit(code)


@task
def leave_a_sleeper(path):
    """Start a process that would outlive the task, and say its pid."""
    p = subprocess.Popen(["sleep", "300"], start_new_session=True)
    with open(path, "w") as f:
        f.write(str(p.pid))
    return p.pid


@task
def grow(mb):
    HELD.append(b"x" * (mb << 20))
    return os.getpid()


@task
def marker(path, first_forever):
    """The marker job of tests.helpers.workers as a task: a line at its start, each 50 ms and at its end, with its
    job, worker, lease token, process group and pid; the first run of a job (none in the file yet) runs on forever."""
    job, token = os.environ["PILOOP_JOB"], os.environ["PILOOP_LEASE_TOKEN"]
    at = worker_name()

    def line(ev):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(fd, f"{ev} {job} {at} {token} {os.getpgid(0)} {time.time():.3f} {os.getpid()}\n".encode())
        os.close(fd)

    forever = first_forever and not (os.path.exists(path) and f" {job} " in open(path).read())
    line("start")
    end = time.time() + (10_000 if forever else 1.0)
    while time.time() < end:
        time.sleep(0.05)
        line("tick")
    line("end")
    return os.getpid()


@task
def runs(path, hold):
    """Append this run's pid to `path`; the first run (none in the file yet) then waits up to `hold` seconds (to be
    killed from outside), a later one returns at once. The pids of every run so far."""
    first = not os.path.exists(path)
    with open(path, "a") as f:
        f.write(f"{os.getpid()}\n")
    if first:
        time.sleep(hold)
    with open(path) as f:
        return [int(line) for line in f.read().split()]


@task
def hang(seconds):
    """Sleep `seconds` (a task that hangs: its timeout ends it)."""
    time.sleep(seconds)
    return os.getpid()


@task
def leave_children(path):
    """Start processes that would outlive the task (one in its group, one in a session of its own, one orphaned by
    a shell that exits), write their pids to `path`, and return at once."""
    kids = [subprocess.Popen(["sleep", "300"]).pid, subprocess.Popen(["sleep", "300"], start_new_session=True).pid]
    orphan = subprocess.run(["sh", "-c", "sleep 300 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True)
    kids.append(int(orphan.stdout.strip()))
    with open(path, "w") as f:
        f.write(" ".join(map(str, kids)))
    return os.getpid()


@task
def close_stdout():
    """Close the process's stdout and stderr (descriptors 1 and 2), then return."""
    print("closing", flush=True)
    os.close(1)
    os.close(2)
    return os.getpid()


@task
def say(text):
    """Print `text` (to the task's log) and return the process's pid."""
    print(text, flush=True)
    return os.getpid()


@task
def big(n):
    """A result of `n` bytes of text: past the inline cap, it goes through the CAS."""
    return "x" * n
