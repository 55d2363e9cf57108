"""Issue 50's list of what a task or a process job may do to its slot, on a real `piloop serve` whose worker has one
evaluation slot (so every job here runs on the same slot, one after another): a task that hangs past its timeout,
one that leaves children behind, one that closes its stdout, one that calls `os._exit(0)` or `os._exit(3)`, a
process job that ignores SIGTERM and is cancelled, a task whose module fails to import, one that grows past
`warm_max_rss_mb`, and a result too large to ride inline. Each ends as docs/worker.md says, and the task after it,
on the same slot, runs and says what it should.

What is asserted is what a user sees (job states, reasons, results, logs) and the processes themselves, so these hold
whatever keeps the slot's processes (a shim today, a slot supervisor later)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from piloop_common.bytecaps import INLINE_MAX_BYTES, inline
from piloop_common.errors import TaskFailed
from piloop_common.tasks import Client
from tests.helpers import warm_tasks_mod as m
from tests.helpers.jobprocs import parent_of, pid_in, pid_job_argv, running
from tests.helpers.redis import wait_for
from tests.helpers.serve import FAST_EXECUTOR, Daemon, short_home
from tests.helpers.slowdown import scaled
from tests.helpers.workers import KILL_GRACE, RENEW

REPO = str(Path(__file__).resolve().parents[2])
ONE_SLOT = FAST_EXECUTOR.replace("evaluations = 2", "evaluations = 1")
assert ONE_SLOT != FAST_EXECUTOR
RSS_MB = 150
WAIT = scaled(60)


@pytest.fixture(scope="module")
def slot(redis_server) -> Iterator[Daemon]:
    d = Daemon(
        short_home(),
        config=ONE_SLOT + f"\n[plugins.tasks]\nwarm_max_tasks = 1000\nwarm_max_rss_mb = {RSS_MB}\n",
        redis_url=redis_server.url,
        namespace="t" + uuid.uuid4().hex[:10],
        env={"PYTHONPATH": REPO},
    )
    d.start()
    yield d
    d.cleanup()


@pytest.fixture
def client(slot) -> Iterator[Client]:
    with Client.from_env(slot.home) as c:
        yield c


def _ok(t, *args, client: Client):
    r = t.apply_async(args, client=client)
    view = client.wait(r.id, timeout=WAIT)
    assert view.state == "succeeded", (view.state, view.reason, view.result)
    return r.get(timeout=WAIT)


def _next_runs(client: Client) -> int:
    """The slot is usable: the next task runs, its print reaches its log, and it returns; its process's pid."""
    text = f"next {uuid.uuid4().hex[:6]}"
    r = m.say.apply_async((text,), client=client)
    view = client.wait(r.id, timeout=WAIT)
    assert view.state == "succeeded", (view.state, view.reason, view.result)
    assert client.log(r.id).decode().splitlines() == [text], client.log(r.id)
    return r.get(timeout=WAIT)


def test_a_task_that_hangs_ends_at_its_timeout_and_the_slot_runs_the_next(client):
    before = _ok(m.where, client=client)["pid"]
    r = m.hang.apply_async((600,), timeout=2, client=client)
    t0 = time.monotonic()
    view = client.wait(r.id, timeout=WAIT)
    assert view.state == "failed" and view.reason.startswith("timeout"), (view.state, view.reason)
    assert time.monotonic() - t0 < scaled(30)
    assert not running(before)  # the process the task hung in was ended with it
    assert _next_runs(client) != before


def test_a_task_that_leaves_children_and_returns_has_them_killed_and_the_slot_runs_the_next(client, tmp_path):
    path = tmp_path / "kids"
    pid = _ok(m.leave_children, str(path), client=client)
    kids = [int(p) for p in path.read_text().split()]
    assert len(kids) == 3
    wait_for(
        lambda: not any(running(k) for k in kids), 10, interval=0.05, what="the processes the task left to be killed"
    )
    assert _next_runs(client) == pid  # the warm process itself lives on for the next


def test_a_task_that_closes_its_stdout_still_returns_and_the_next_task_is_heard(client):
    r = m.close_stdout.apply_async(client=client)
    view = client.wait(r.id, timeout=WAIT)
    assert view.state == "succeeded", (view.state, view.reason)
    assert client.log(r.id).decode().splitlines() == ["closing"]
    _next_runs(client)  # its print reaches its own log: the next task's stdout is whole again


@pytest.mark.parametrize("code", [0, 3])
def test_a_task_that_calls_os_exit_fails_with_its_status_and_the_next_gets_a_fresh_process(client, code):
    pid = _ok(m.where, client=client)["pid"]
    r = m.die.apply_async((code,), client=client)
    view = client.wait(r.id, timeout=WAIT)
    # it ended its process without a result: failed with the status it exited with, never succeeded
    assert view.state == "failed" and view.result.exit_code == code, (view.state, view.reason, view.result)
    assert view.attempts == 1
    with pytest.raises(TaskFailed):
        r.get(timeout=WAIT)
    wait_for(lambda: not running(pid), 10, interval=0.05, what=f"the exited process {pid} to be gone")
    assert _next_runs(client) != pid


def test_a_process_job_that_ignores_sigterm_is_killed_after_the_grace_when_cancelled(client, tmp_path):
    pid_file, terms = tmp_path / "pid", tmp_path / "terms"
    # it notes each SIGTERM's time and goes on (its `sleep` dies of it; the loop starts another)
    script = f"trap 'date +%s.%N >> {terms}' TERM; while :; do sleep 0.05; done"
    job = client.submit(pid_job_argv(pid_file, script))
    pid = pid_in(pid_file)
    assert running(pid) and parent_of(pid) > 1
    client.api.call("POST", f"/v1/jobs/{job}/cancel")
    # the cancel reaches the worker at its next heartbeat; SIGTERM does not end it, SIGKILL after the kill grace does
    wait_for(lambda: not running(pid), RENEW * 2 + KILL_GRACE + 3, interval=0.02, what="the job to be killed")
    dead = time.time()  # at or after its death
    view = client.wait(job, timeout=WAIT)
    assert view.state == "cancelled", (view.state, view.reason)
    termed = [float(t) for t in terms.read_text().split()] if terms.exists() else []
    assert termed, "it was killed without a SIGTERM first"
    print(f"\nthe job that ignores SIGTERM was gone {dead - termed[0]:.2f} s after it (kill grace {KILL_GRACE:g} s)")
    # it outlived its SIGTERM by the grace (less the 50 ms its shell may take to run the trap, and some of a loaded
    # machine's lag): SIGKILL came only after it
    assert dead - termed[0] >= KILL_GRACE * 0.5, (termed, dead)
    _next_runs(client)


def test_a_task_whose_module_fails_to_import_fails_saying_why_and_the_slot_runs_the_next(client):
    blob = json.dumps({"args": [], "kwargs": {}}).encode()
    carried = inline(blob)
    assert carried is not None
    job = client.submit(["tests.helpers.broken_tasks_mod:never"], runner="task", inline_inputs={"args.json": carried})
    view = client.wait(job, timeout=WAIT)
    said = f"{view.reason}\n{client.log(job).decode(errors='replace')}"
    assert view.state == "failed", (view.state, view.reason)
    assert "broken_tasks_mod cannot be imported: it says so on purpose" in said, said
    assert view.attempts == 1
    _next_runs(client)


def test_a_task_grown_past_warm_max_rss_mb_retires_its_process_and_the_next_gets_a_fresh_one(client):
    pid = _ok(m.where, client=client)["pid"]
    assert _ok(m.grow, RSS_MB + 50, client=client) == pid  # the task itself succeeds
    wait_for(lambda: not running(pid), 10, interval=0.05, what="the grown process to be retired")
    assert _next_runs(client) != pid


def test_a_result_too_large_to_inline_arrives_through_the_cas_and_the_slot_runs_the_next(client):
    n = 4 * INLINE_MAX_BYTES
    r = m.big.apply_async((n,), client=client)
    assert r.get(timeout=WAIT) == "x" * n
    view = client.show(r.id)
    assert view.state == "succeeded" and "result.json" in view.result.outputs, view.result
    assert not view.result.inline_outputs
    assert json.loads(client.get_blob(view.result.outputs["result.json"])) == {"value": "x" * n}
    _next_runs(client)
