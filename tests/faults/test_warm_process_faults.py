"""A warm task process on a real `piloop serve` with one evaluation slot, whatever happens beside it: a plain process
job between two tasks on the slot, and the task process SIGKILLed from outside (as the OOM killer would) between
tasks and during one. The next task always runs; a task whose process was killed under it is queued again as a lost
worker's is (not an attempt), never `failed` for a cause that is not its own.

What is asserted is what a user sees (job states, results, attempts, the events), so these hold whatever keeps the
slot's processes (a shim today, a slot supervisor later)."""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path

import pytest

from piloop_common.tasks import Client
from tests.helpers import warm_tasks_mod as m
from tests.helpers.redis import wait_for
from tests.helpers.serve import FAST_EXECUTOR, Daemon, short_home
from tests.helpers.slowdown import scaled
from tests.helpers.workers import events

REPO = str(Path(__file__).resolve().parents[2])
# one evaluation slot: each job, task or process, goes to the same slot
ONE_SLOT = FAST_EXECUTOR.replace("evaluations = 2", "evaluations = 1")
assert ONE_SLOT != FAST_EXECUTOR
WAIT = scaled(60)


@pytest.fixture(scope="module")
def warm(redis_server):
    d = Daemon(
        short_home(),
        config=ONE_SLOT + "\n[plugins.tasks]\nwarm_max_tasks = 100\n",
        redis_url=redis_server.url,
        namespace="t" + uuid.uuid4().hex[:10],
        env={"PYTHONPATH": REPO},
    )
    d.start()
    yield d
    d.cleanup()


@pytest.fixture
def client(warm):
    with Client.from_env(warm.home) as c:
        yield c


def _task(t, *args, client):
    r = t.apply_async(args, client=client)
    view = client.wait(r.id, timeout=WAIT)
    assert view.state == "succeeded", (view.state, view.reason, view.result)
    return r.get(timeout=WAIT)


def test_a_process_job_between_two_tasks_on_one_slot_leaves_the_next_task_running(client):
    assert _task(m.where, client=client)["calls"] >= 1
    for argv in (["true"], ["sh", "-c", "echo plain; exit 3"]):
        job = client.submit(argv)
        view = client.wait(job, timeout=WAIT)
        assert view.state in ("succeeded", "failed") and view.result.exit_code == (0 if argv == ["true"] else 3)
        got = _task(m.where, client=client)  # the task after it, on the same slot
        assert got["job"] and got["cwd"].endswith("/work"), got
    assert _task(m.get_env, "HOME", client=client) is not None


def test_a_warm_process_killed_from_outside_between_tasks_leaves_the_next_task_running(client):
    for _ in range(2):
        pid = _task(m.where, client=client)["pid"]
        os.kill(pid, signal.SIGKILL)  # as the OOM killer would, while the slot is idle
        wait_for(lambda pid=pid: not _running(pid), 10, what=f"process {pid} to end")
        r = m.where.apply_async(client=client)
        view = client.wait(r.id, timeout=WAIT)
        assert view.state == "succeeded" and view.attempts == 1, view
        assert r.get(timeout=WAIT)["pid"] != pid


def test_a_warm_process_killed_during_its_task_queues_the_task_again_and_the_next_runs(warm, client, tmp_path):
    path = tmp_path / "runs"
    r = m.runs.apply_async((str(path), 120), client=client)
    first = wait_for(lambda: path.exists() and path.read_text().split(), WAIT, what="the task's first run")
    pid = int(first[0])
    os.kill(pid, signal.SIGKILL)  # under its task, as the OOM killer would
    view = client.wait(r.id, timeout=WAIT)
    # run again (a second pid), and the run the kill ended is no attempt: not `failed`, never retried as one
    assert view.state == "succeeded" and view.attempts == 1, view
    assert r.get(timeout=WAIT) == [pid, int(path.read_text().split()[1])]
    # the worker's one word on the killed run: queued again (a lost run), not failed nor retrying (an attempt)
    said = [
        (e["type"], e.get("reason", ""))
        for e in events(warm, "job.queued", "job.failed", "job.retrying")
        if e.get("job") == r.id and e.get("by") == "worker:serve"
    ]
    assert [t for t, _ in said] == ["job.queued"], said
    assert _task(m.where, client=client)["pid"] != pid  # and the task after it runs


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False
