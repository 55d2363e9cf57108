"""Warm task processes on a real `piloop serve`: tasks one after another in one long-lived process, each with its own
dir and environment; what ends that process (a crash, a task that leaked, `warm_max_tasks`) and what a task leaves
running; and `processes = "fresh"`, a fork for each task."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import psutil
import pytest

from piloop_common.errors import TaskFailed
from piloop_common.tasks import Client
from tests.helpers import warm_tasks_mod as m
from tests.helpers.redis import wait_for
from tests.helpers.serve import FAST_EXECUTOR, Daemon, short_home
from tests.helpers.slowdown import scaled

REPO = str(Path(__file__).resolve().parents[2])
# one evaluation slot: each task goes to the one shim, and so to its warm process
ONE_SLOT = FAST_EXECUTOR.replace("evaluations = 2", "evaluations = 1")
assert ONE_SLOT != FAST_EXECUTOR


def _daemon(redis_server, tasks: str) -> Daemon:
    d = Daemon(
        short_home(),
        config=ONE_SLOT + "\n[plugins.tasks]\n" + tasks,
        redis_url=redis_server.url,
        namespace="t" + uuid.uuid4().hex[:10],
        env={"PYTHONPATH": REPO},
    )
    d.start()
    return d


@pytest.fixture(scope="module")
def warm(redis_server):
    d = _daemon(redis_server, "warm_max_tasks = 4\nwarm_max_rss_mb = 200\n")
    yield d
    d.cleanup()


@pytest.fixture
def client(warm):
    with Client.from_env(warm.home) as c:
        yield c


def _run(t, *args, client):
    return t.apply_async(args, client=client).get(timeout=scaled(60))


def _fresh_start(client) -> int:
    """End whatever warm process there is (a task that exits it), so a test counts from a fresh one."""
    with pytest.raises(TaskFailed):
        _run(m.die, 3, client=client)
    return _run(m.where, client=client)["pid"]


def test_tasks_run_in_one_warm_process_each_in_its_slot_s_dir_and_own_environment(client):
    pid = _fresh_start(client)
    a, b = _run(m.where, client=client), _run(m.where, client=client)
    assert a["pid"] == b["pid"] == pid and a["pgid"] == pid  # no fork: the same process, its own group
    assert b["calls"] == a["calls"] + 1  # its module's state kept, as in Celery's prefork children
    for got in (a, b):
        # its cwd is its slot's work/ (emptied at each start), under $PILOOP_JOB_DIR, the slot's dir
        assert got["cwd"] == os.path.join(got["dir"], "work") and "/slots/" in got["dir"]
    assert a["job"] != b["job"]
    # what a task does to its environment ends with it
    assert _run(m.set_env, "WARM_LEAK", "1", client=client) == pid
    assert _run(m.get_env, "WARM_LEAK", client=client) is None


def test_a_task_that_ends_its_process_fails_and_the_next_task_gets_a_fresh_one(client):
    pid = _fresh_start(client)
    r = m.die.apply_async((7,), client=client)
    with pytest.raises(TaskFailed):
        r.get(timeout=scaled(60))
    view = client.show(r.id)
    assert view.state == "failed" and view.result.exit_code == 7
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert _run(m.where, client=client)["pid"] != pid


def test_after_warm_max_tasks_a_fresh_process_takes_over(client):
    pid = _fresh_start(client)  # its first task
    pids = [_run(m.where, client=client)["pid"] for _ in range(4)]
    assert pids[:3] == [pid] * 3 and pids[3] != pid, (pid, pids)  # warm_max_tasks = 4


def test_a_process_grown_past_warm_max_rss_mb_is_replaced_after_its_task(client):
    pid = _fresh_start(client)
    assert _run(m.grow, 8, client=client) == pid  # well under 200 MiB: it stays
    assert _run(m.where, client=client)["pid"] == pid
    assert _run(m.grow, 300, client=client) == pid  # the task succeeds; the process is retired after it
    assert _run(m.where, client=client)["pid"] != pid


def test_what_a_task_leaves_running_is_killed_and_its_warm_process_lives_on(client, tmp_path):
    pid = _fresh_start(client)
    sleeper = _run(m.leave_a_sleeper, str(tmp_path / "pid"), client=client)
    wait_for(
        lambda: not psutil.pid_exists(sleeper) or psutil.Process(sleeper).status() == psutil.STATUS_ZOMBIE,
        10,
        interval=0.05,
        what="the process the task left to be killed",
    )
    assert _run(m.where, client=client)["pid"] == pid


def test_fresh_processes_fork_each_task(redis_server):
    d = _daemon(redis_server, 'processes = "fresh"\n')
    try:
        with Client.from_env(d.home) as c:
            a, b = _run(m.where, client=c), _run(m.where, client=c)
        assert a["pid"] != b["pid"] and a["calls"] == b["calls"] == 1
    finally:
        d.cleanup()
