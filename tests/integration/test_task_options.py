"""The Python API's task options on a real `piloop serve` and real workers (docs/jobs.md, "Task options"): retries
with backoff measured from the job's events, retry_on, countdown and eta never run early, expires never run, priority
order on a single-slot worker, cancel of a running task through its handle, a failing task's traceback."""

from __future__ import annotations

import datetime as dt
import uuid
from pathlib import Path

import pytest

from piloop_common.errors import TaskFailed, TaskRevoked
from piloop_common.tasks import AsyncResult, Client
from tests.helpers import tasks_mod
from tests.helpers.redis import wait_for
from tests.helpers.slowdown import scaled
from tests.helpers.workers import RemoteWorker, events, tcp_server, token

REPO = str(Path(__file__).resolve().parents[2])


@pytest.fixture(scope="module")
def server(redis_server):
    # the serve pool's worker (2 slots) runs most tests; the gpu pool (1 slot) has a worker only where a test starts
    # one; both import tests.helpers from the repo
    d = tcp_server(redis_server.url, "t" + uuid.uuid4().hex[:10], env={"PYTHONPATH": REPO})
    yield d
    d.cleanup()


@pytest.fixture
def client(server):
    with Client.from_env(server.home) as c:
        yield c


@pytest.fixture
def gpu_worker(server):
    w = RemoteWorker(server, token(server, "g" + uuid.uuid4().hex[:6], "--pool", "gpu"), env={"PYTHONPATH": REPO})
    yield w
    w.cleanup()


def _ms(event: dict) -> int:
    """When an event was written, by Redis's clock (its stream id)."""
    return int(event["id"].partition("-")[0])


def _of(server, job: str, *types: str) -> list[dict]:
    return [e for e in events(server, *types) if e.get("job") == job]


def test_a_failing_task_is_retried_after_its_backoff_each_wait_twice_as_long(server, client, tmp_path):
    marker = tmp_path / "attempts"
    r = tasks_mod.flaky.apply_async((str(marker), 2), client=client)  # retries=2, retry_backoff=1, retry_on OSError
    assert r.get(timeout=scaled(60)) == 3 and marker.read_text() == "..."
    assert r.successful() and client.show(r.id).attempts == 3
    retrying = _of(server, r.id, "job.retrying")
    leases = [_ms(e) for e in _of(server, r.id, "lease.granted")]
    assert [int(e["delay_ms"]) for e in retrying] == [1000, 2000], retrying
    assert "attempt 1 of 3 failed" in retrying[0]["reason"] and "attempt 2 of 3" in retrying[1]["reason"]
    assert len(leases) == 3
    for failed, next_lease in zip(retrying, leases[1:], strict=True):
        assert next_lease - _ms(failed) >= int(failed["delay_ms"]), (failed, next_lease)


def test_retry_on_retries_only_the_exceptions_it_names(server, client, tmp_path):
    marker = tmp_path / "attempts"
    r = tasks_mod.flaky.apply_async((str(marker), 2), {"kind": "value"}, client=client)
    with pytest.raises(TaskFailed) as e:
        r.get(timeout=scaled(60))
    assert "ValueError: attempt 1 fails" in e.value.message and e.value.details["error_type"] == "ValueError"
    view = client.show(r.id)
    assert view.state == "failed" and view.attempts == 1 and marker.read_text() == "."
    assert "not retried: builtins.ValueError is not in its retry_on" in view.reason, view.reason
    assert not _of(server, r.id, "job.retrying")
    # the same task, told at submit to retry ValueError too: retried
    again = tmp_path / "again"
    r2 = tasks_mod.flaky.apply_async((str(again), 1), {"kind": "value"}, retry_on=(ValueError,), client=client)
    assert r2.get(timeout=scaled(60)) == 2 and again.read_text() == ".."


def test_a_countdown_is_not_run_before_its_time(server, client):
    r = tasks_mod.add.apply_async((1, 2), countdown=1.5, client=client)
    view = client.show(r.id)
    assert view.state == "queued" and view.not_before_ms == view.created_ms + 1500, view
    assert r.get(timeout=scaled(60)) == 3
    queued, started = _of(server, r.id, "job.queued"), _of(server, r.id, "lease.granted")
    assert _ms(started[0]) - _ms(queued[0]) >= 1500, (queued, started)
    assert [e["after"] for e in _of(server, r.id, "job.requeued")] == ["countdown"]


def test_an_eta_is_not_run_before_it(server, client):
    eta = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1.5)
    r = tasks_mod.add.apply_async((2, 3), eta=eta, client=client)
    assert r.get(timeout=scaled(60)) == 5
    started = _of(server, r.id, "lease.granted")
    assert _ms(started[0]) >= int(eta.timestamp() * 1000), (eta, started)


def test_an_expired_task_behind_a_busy_worker_never_runs_and_a_running_one_is_cancelled_by_its_handle(
    server, client, gpu_worker
):
    gpu_worker.start()
    busy = tasks_mod.sleepy.apply_async((60,), pool="gpu", client=client)
    wait_for(lambda: busy.state == "running", 30, what="the gpu worker to run the sleeper")
    late = tasks_mod.add.apply_async((1, 1), pool="gpu", expires=1, client=client)
    wait_for(lambda: late.ready(), 30, what="the queued task to expire")
    assert late.state == "expired" and not late.successful() and late.traceback is None
    assert not _of(server, late.id, "lease.granted")  # never leased, so never run
    assert client.show(late.id).attempts == 0 and _of(server, late.id, "job.expired")
    with pytest.raises(TaskRevoked, match=r"expired: not started within 1\.0 s"):
        late.get(timeout=5)
    assert isinstance(late.result, TaskRevoked)

    assert busy.cancel() == "cancelling"
    wait_for(lambda: busy.ready(), 30, what="the running task to be cancelled")
    assert busy.state == "cancelled"
    with pytest.raises(TaskRevoked, match="cancelled"):
        busy.get(timeout=5)


def test_a_single_slot_worker_starts_the_highest_priority_first_fifo_within_one(server, client, gpu_worker):
    plan = [("low", 0), ("high", 9), ("mid1", 5), ("mid2", 5), ("low2", 0)]
    got = {name: tasks_mod.add.apply_async((0, 0), pool="gpu", priority=p, client=client) for name, p in plan}
    assert all(r.state == "queued" for r in got.values())  # no gpu worker yet
    gpu_worker.start()
    for r in got.values():
        assert r.get(timeout=scaled(60)) == 0
    by_job = {r.id: name for name, r in got.items()}
    order = [by_job[e["job"]] for e in events(server, "lease.granted") if e.get("job") in by_job]
    assert order == ["high", "mid1", "mid2", "low", "low2"], order


def test_a_failing_tasks_handle_has_its_traceback_and_get_names_the_remote_exception(client):
    r = tasks_mod.boom.apply_async(("no good",), client=client)
    with pytest.raises(TaskFailed) as e:
        r.get(timeout=scaled(60))
    assert e.value.message.startswith(f"task {r.id} failed: ValueError: no good")
    assert r.ready() and not r.successful() and r.state == "failed"
    assert "raise ValueError(message)" in r.traceback and r.traceback.startswith("Traceback")
    attached = AsyncResult(r.id, client=client)  # re-attached by id: its serializer is read from the job
    assert attached.serializer == "json" and isinstance(attached.result, TaskFailed)
    assert attached.traceback == r.traceback
    with pytest.raises(TaskFailed, match="ValueError: no good"):
        attached.get(timeout=5)


def test_a_job_id_of_the_callers_choosing(client):
    job_id = "mine-" + uuid.uuid4().hex[:8]
    r = tasks_mod.add.apply_async((4, 5), job_id=job_id, client=client)
    assert r.id == job_id and r.get(timeout=scaled(60)) == 9
    from piloop_common.errors import Conflict

    with pytest.raises(Conflict, match="exists"):
        tasks_mod.add.apply_async((4, 5), job_id=job_id, client=client)


def test_job_submit_takes_the_timing_flags_and_show_and_list_print_them(server):
    job = server.cli(
        "job", "submit", "--priority", "4", "--countdown", "1h", "--expires", "2h", "--", "true", check=True
    ).stdout.strip()
    try:
        shown = server.cli("job", "show", job, check=True).stdout
        lines = dict(line.split(None, 1) if " " in line else (line, "") for line in shown.splitlines())
        assert lines["state"].strip() == "queued" and lines["priority"].startswith("4 (of 0-9, 9 first)"), shown
        assert "not before" in shown and "expires" in shown and "waiting" not in shown, shown
        with server.api() as api:
            view = api.call("GET", f"/v1/jobs/{job}")
        assert view["spec"]["priority"] == 4 and view["spec"]["countdown_seconds"] == 3600.0
        assert view["not_before_ms"] == view["created_ms"] + 3_600_000, view
        assert view["expires_ms"] == view["created_ms"] + 7_200_000
        listed = server.cli("job", "list", "--state", "queued", check=True).stdout
        row = next(line for line in listed.splitlines() if line.split()[0] == job)
        assert "(not before" in row and "p4" in row, row
    finally:
        assert server.cli("job", "cancel", job, check=True).stdout.strip() == f"{job}: cancelled"
