"""The server's background work (piloop_server.tasks) on a real `piloop serve`: its rq workers, their retries, and
their lives tied to the server's."""

from __future__ import annotations

import itertools
import signal
import types
import uuid
from pathlib import Path

import psutil
import pytest

from piloop_server import tasks
from piloop_server.state.keys import Keys
from piloop_server.state.taskqueue import TaskQueues
from tests.helpers.redis import wait_for
from tests.helpers.serve import FAST_EXECUTOR, Daemon, short_home

REPO = str(Path(__file__).resolve().parents[2])
MOD = "tests.helpers.background_tasks"


# a provisioned pool that never starts a worker: its queue has a background worker of its own
GPU = (
    "\n[plugins.executor.pools.gpu]\nagents = 0\nevaluations = 1\n\n[plugins.executor.pools.gpu.provisioner]\n"
    'max = 0\n\n[plugins.executor.pools.gpu.provisioner.compute]\nprovider = "local"\n'
)


def _daemon(redis_server) -> Daemon:
    ns = "t" + uuid.uuid4().hex[:10]
    # the workers import the tests' task module; the tasks it submits itself retry 1 s apart
    d = Daemon(
        short_home(),
        config=FAST_EXECUTOR + GPU,
        redis_url=redis_server.url,
        namespace=ns,
        env={"PYTHONPATH": REPO, tasks.RETRY_ENV: "1,1"},
    )
    d.ns = ns  # type: ignore[attr-defined]
    return d.start()


@pytest.fixture(scope="module")
def server(redis_server):
    d = _daemon(redis_server)
    yield d
    d.cleanup()


@pytest.fixture
def rt(server, redis_client):
    return _submitter(redis_client, server.ns)


def _submitter(redis_client, ns: str) -> types.SimpleNamespace:
    """What submit needs of a runtime: the task queues under the server's namespace (this process's rq has its
    default prefix, not the server's)."""
    keys = Keys(ns)
    return types.SimpleNamespace(keys=keys, taskqueues=TaskQueues(redis_client, keys.rq_prefix()))


def _events(d: Daemon, type_: str, name: str) -> list[dict]:
    with d.api() as api:
        return [
            e
            for e in api.call("GET", "/v1/events", params={"count": 10_000})
            if e["type"] == type_ and e.get("name", e.get("key")) == name
        ]


def _background(d: Daemon) -> dict[str, psutil.Process]:
    """serve's background workers, by queue."""
    out = {}
    for p in psutil.Process(d.proc.pid).children():
        with_args = p.cmdline()
        if "piloop_server.tasks" in " ".join(with_args):
            out[with_args[with_args.index("--queue") + 1]] = p
    return out


def test_a_task_runs_in_a_background_worker_and_one_key_runs_once_at_a_time(server, rt):
    name = uuid.uuid4().hex[:8]
    assert tasks.submit(rt, f"{MOD}:mark", name, 1.0, key=f"test.mark:{name}")
    assert not tasks.submit(rt, f"{MOD}:mark", name, 1.0, key=f"test.mark:{name}")  # queued or running: nothing
    done = wait_for(lambda: _events(server, "test.done", name), 30, interval=0.1, what="the task's effect")
    assert int(done[0]["pid"]) == _background(server)["default"].pid  # run by serve's worker of its queue
    assert len(_events(server, "test.started", name)) == 1
    # once it has ended, the same key runs again
    wait_for(
        lambda: tasks.submit(rt, f"{MOD}:mark", name, key=f"test.mark:{name}"),
        5,
        interval=0.05,
        what="a second submit once the first ended",
    )
    wait_for(lambda: len(_events(server, "test.done", name)) == 2, 30, interval=0.1, what="the second run")


def test_a_task_that_raises_is_retried_with_backoff_then_is_a_task_failed_event(server, rt, monkeypatch):
    # read where the task is submitted; rq schedules in whole seconds, so a 2 s wait is 1–3 s
    monkeypatch.setenv(tasks.RETRY_ENV, "2,2")
    name = uuid.uuid4().hex[:8]
    key = f"test.boom:{name}"
    assert tasks.submit(rt, f"{MOD}:boom", name, key=key)
    failed = wait_for(lambda: _events(server, "task.failed", key), 30, interval=0.1, what="the task.failed event")
    attempts = _events(server, "test.attempt", name)
    assert len(attempts) == 3  # the first run and two retries
    at = [int(e["id"].split("-")[0]) for e in attempts]
    assert all(b - a >= 1000 for a, b in itertools.pairwise(at)), at  # each retry waited (an immediate one takes ms)
    assert len(failed) == 1 and failed[0]["func"] == f"{MOD}:boom"
    assert failed[0]["error"] == f"ValueError: {name} always fails"
    assert tasks.submit(rt, f"{MOD}:boom", name, key=key)  # a failed task's key can run again


def test_a_slow_task_on_one_queue_never_delays_another_queue(server, rt):
    slow, quick = uuid.uuid4().hex[:8], uuid.uuid4().hex[:8]
    assert tasks.submit(rt, f"{MOD}:mark", slow, 8.0, key=f"test.mark:{slow}", queue=tasks.provisioner_queue("gpu"))
    wait_for(lambda: _events(server, "test.started", slow), 30, interval=0.05, what="the slow platform call starts")
    assert tasks.submit(rt, f"{MOD}:mark", quick, key=f"test.mark:{quick}")
    done = wait_for(lambda: _events(server, "test.done", quick), 6, interval=0.05, what="the other queue's task")
    assert not _events(server, "test.done", slow)  # it ran beside the slow one, not after it
    assert int(done[0]["pid"]) == _background(server)["default"].pid
    assert int(_events(server, "test.started", slow)[0]["pid"]) == _background(server)["provisioner.gpu"].pid


def test_a_killed_background_worker_is_restarted_and_its_tasks_still_run(server, rt):
    name, queued = uuid.uuid4().hex[:8], uuid.uuid4().hex[:8]
    assert tasks.submit(rt, f"{MOD}:mark", name, 5.0, key=f"test.mark:{name}")
    wait_for(lambda: _events(server, "test.started", name), 30, interval=0.05, what="the long task starts")
    before = _background(server)
    assert set(before) == {"default", "provisioner.gpu"}
    assert tasks.submit(rt, f"{MOD}:mark", queued, key=f"test.mark:{queued}")
    before["default"].send_signal(signal.SIGKILL)
    # the task queued behind it runs on the worker serve starts in its place; the one it was running is retried
    done = wait_for(lambda: _events(server, "test.done", queued), 30, interval=0.1, what="the queued task runs")
    now = _background(server)["default"]
    assert now.pid != before["default"].pid and int(done[0]["pid"]) == now.pid
    wait_for(
        lambda: len(_events(server, "test.started", name)) == 2,
        30,
        interval=0.1,
        what="the task the killed worker held is retried",
    )


def test_killing_serve_leaves_no_background_process(redis_server, redis_client):
    d = _daemon(redis_server)
    try:
        # the gpu pool's worker comes with the pass's first listing; the default queue's with its first task
        wait_for(lambda: "provisioner.gpu" in _background(d), 10, interval=0.05, what="the gpu queue's worker")
        assert "default" not in _background(d)
        name = uuid.uuid4().hex[:8]
        tasks.submit(_submitter(redis_client, d.ns), f"{MOD}:mark", name, key=name)
        wait_for(lambda: _events(d, "test.done", name), 10, interval=0.05, what="a task on the default queue")
        procs = list(_background(d).values())
        assert len(procs) == 2
        d.kill()

        def gone() -> bool:
            for p in procs:
                try:
                    if p.status() != psutil.STATUS_ZOMBIE:
                        return False
                except psutil.NoSuchProcess:
                    pass
            return True

        wait_for(gone, 10, interval=0.05, what="serve's background workers die with it")
    finally:
        d.cleanup()
