"""Periodic schedules: `piloop schedule add|list|remove`, and each tick queued once with two daemons on one Redis."""

from __future__ import annotations

import json
import threading
import uuid

import pytest

from piloop_server.schedules import next_after
from piloop_server.state.jobs import JobsState
from piloop_server.state.keys import Keys
from piloop_server.state.schedules import ScheduleRecord, SchedulesState
from tests.helpers.redis import wait_for
from tests.helpers.serve import FAST_EXECUTOR, Daemon, short_home


@pytest.fixture
def two_daemons(redis_server):
    """Two `piloop serve` on one Redis and one namespace, each with its own home, pass and serve worker."""
    ns = "t" + uuid.uuid4().hex[:10]
    ds = [Daemon(short_home(), config=FAST_EXECUTOR, redis_url=redis_server.url, namespace=ns) for _ in range(2)]
    try:
        for d in ds:
            d.start()
        yield ds
    finally:
        for d in ds:
            d.cleanup()


def queued_by(d: Daemon, name: str) -> list[str]:
    """The ids of the jobs schedule `name` queued, in order, from the events (each `job.queued` once per job)."""
    out = d.cli("events", "--last", "5000", "--json")
    assert out.returncode == 0, out.stderr
    events = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    return [e["job"] for e in events if e.get("type") == "job.queued" and e.get("by") == f"schedule:{name}"]


def test_each_tick_queues_one_job_with_two_daemons_running(two_daemons):
    a, b = two_daemons
    out = a.cli("schedule", "add", "every-second", "--cron", "* * * * * *", "--", "true")
    assert out.returncode == 0, out.stderr
    listed = b.cli("schedule", "list")
    assert listed.returncode == 0 and "every-second" in listed.stdout and "* * * * * *" in listed.stdout
    wait_for(lambda: len(queued_by(a, "every-second")) >= 4, 60, 0.2, "four ticks")
    assert b.cli("schedule", "remove", "every-second").returncode == 0
    got = queued_by(b, "every-second")
    assert len(got) == len(set(got)), f"a tick was queued twice: {got}"
    ticks = [int(j.rsplit(".", 1)[1]) for j in got]
    assert ticks == sorted(ticks) and len(ticks) >= 4, got
    for job in got[:4]:
        view = a.api().call("GET", f"/v1/jobs/{job}")
        assert view["spec"]["argv"] == ["true"] and view["pool"] == "serve"
    assert "no schedules" in a.cli("schedule", "list").stdout


def test_bad_schedules_are_refused_with_what_was_wrong(two_daemons):
    a, _ = two_daemons
    bad = a.cli("schedule", "add", "nightly", "--cron", "every night", "--", "true")
    assert bad.returncode == 2, bad
    assert "--cron 'every night': not a cron" in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
    none = a.cli("schedule", "add", "nightly", "--cron", "0 3 * * *")
    assert none.returncode == 2 and "give the job" in none.stderr, none.stderr
    assert a.cli("schedule", "add", "nightly", "--cron", "0 3 * * *", "--", "true").returncode == 0
    again = a.cli("schedule", "add", "nightly", "--cron", "0 4 * * *", "--", "true")
    assert again.returncode != 0 and "schedule nightly exists" in again.stderr, again.stderr
    gone = a.cli("schedule", "remove", "nope")
    assert gone.returncode != 0 and "no schedule nope" in gone.stderr, gone.stderr


def _yearly(s: SchedulesState, name: str, first_ms: int) -> ScheduleRecord:
    rec = ScheduleRecord(
        name=name,
        cron="0 0 1 1 *",  # its next tick after now is months away: only the one set in the past is due
        kind="evaluation",
        pool="serve",
        spec=json.dumps({"argv": ["true"]}),
        by="test",
        created_ms=first_ms,
    )
    s.add(rec, first_ms)
    return rec


def test_ticks_missed_while_no_daemon_ran_queue_one_job_then_the_next_tick_after_now(redis_client, namespace):
    s = SchedulesState(redis_client, Keys(namespace))
    now = s.now_ms()
    rec = _yearly(s, "missed", now - 3 * 365 * 86400 * 1000)  # three yearly ticks missed
    assert s.tick(next_after) == 1
    assert s.tick(next_after) == 0
    (got,) = s.all()
    assert got.next_ms == next_after(rec.cron, now) > now
    jobs = JobsState(redis_client, Keys(namespace))
    assert jobs.get(rec.job_id(rec.created_ms)) is not None and len(jobs.newest(10)) == 1


def test_two_passes_at_once_queue_each_due_tick_once(redis_client, redis_server, namespace):
    """The pass's schedule step from two processes' worth of clients at once, on one real Redis."""
    import redis

    keys = Keys(namespace)
    mine = SchedulesState(redis_client, keys)
    now = mine.now_ms()
    for i in range(40):
        _yearly(mine, f"s{i}", now - 1000 - i)
    other = redis.Redis.from_url(redis_server.url)
    barrier = threading.Barrier(2)
    counts: list[int] = []

    def one_pass(client) -> None:
        s = SchedulesState(client, keys)
        barrier.wait()
        counts.append(sum(s.tick(next_after) for _ in range(3)))

    threads = [threading.Thread(target=one_pass, args=(c,)) for c in (redis_client, other)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    other.close()
    assert sum(counts) == 40, counts
    assert len(JobsState(redis_client, keys).newest(100)) == 40
