"""One source of timings: renew, grace, toleration, the kill grace and the rest are config.toml's alone.

`piloop limits set` of a timing is refused with the line that says what to do, and a timing limit that a Redis
already holds (written before the rule) is ignored by the pass, with one `limit.ignored` event. The job that the
old behaviour ran twice at once (a worker gone silent, its lease expired on a shortened toleration while its shim
still ran it) runs once at a time: the fence, not the limit, decides.
"""

from __future__ import annotations

import json
import time

from piloop_server.limits import TIMING_KEYS
from piloop_server.state.keys import Keys
from piloop_server.state.limits import LimitsState
from piloop_server.state.records.limit import Limit
from piloop_worker import clock
from tests.helpers.keyspace import DAEMON_CHURN, keyspace, settled
from tests.helpers.redis import wait_for
from tests.helpers.serve import FAST_EXECUTOR
from tests.helpers.workers import (
    FENCE_AFTER,
    KILL_GRACE,
    TOLERATION,
    events,
    kill_tree_of,
    marker_job,
    marker_runs,
    overlapping,
    slot_deadline,
    slot_dirs,
    state,
    tcp_server,
    token,
)


def _running(marker, job: str, n: int, timeout: float = 30) -> dict:
    return wait_for(
        lambda: (r := marker_runs(marker).get(job)) and len(r) >= n and r[n - 1],
        timeout,
        interval=0.05,
        what=f"run {n} of {job}",
    )


def test_every_timing_key_is_refused_by_limits_set_and_nothing_is_stored(server, redis_client, namespace):
    d = server
    keys = Keys(namespace)
    before = settled(redis_client, keys)
    listed = json.loads(d.cli("limits", "list", "--json").stdout or "[]")
    for name in sorted(TIMING_KEYS):
        got = d.cli("limits", "set", f"executor.{name}=1", "--reason", "make it faster")
        err = got.stderr.strip()
        assert got.returncode != 0, (name, got.stdout)
        assert len(err.splitlines()) == 1 and "Traceback" not in err, err
        assert f"executor.{name}" in err and f"edit {name} in config.toml" in err and "restart" in err, err
    assert json.loads(d.cli("limits", "list", "--json").stdout or "[]") == listed
    assert keyspace(redis_client, keys, DAEMON_CHURN) == before


def test_a_stored_timing_limit_is_ignored_and_a_silent_workers_job_never_runs_twice_at_once(
    server, workers, redis_client, namespace, tmp_path
):
    d, marker, keys = server, tmp_path / "marker", Keys(namespace)
    # what Redis could hold from before the rule: a toleration far under the fence (6 s, fenced at 5 s)
    LimitsState(redis_client, keys).put("executor.toleration_seconds", Limit(1.0, "old", "admin", 0))
    ignored = wait_for(
        lambda: [e for e in events(d, "limit.ignored") if e["key"] == "executor.toleration_seconds"],
        10,
        interval=0.1,
        what="the pass to ignore the stored timing",
    )
    assert len(ignored) == 1
    a = workers(d, token(d, "wa")).start()
    job = marker_job(d, marker, seconds=2, first_forever=True)
    first = _running(marker, job, 1)
    state(d, job, "running")
    a.pause()  # silent: its shim still runs the job and fences it at its own deadline
    paused = time.monotonic()
    b = workers(d, token(d, "wb")).start()
    second = _running(marker, job, 2, timeout=TOLERATION + 20)
    requeued_after = time.monotonic() - paused
    runs = marker_runs(marker)[job]
    assert [r["where"] for r in runs[:2]] == ["wa", "wb"], runs
    assert not overlapping(runs), runs
    # the first run's last tick came before the second's start, and the lease outlived config.toml's fence
    assert runs[0]["last"] < second["start"], (first, second)
    assert requeued_after >= FENCE_AFTER + KILL_GRACE - 1, requeued_after
    (exp,) = [e for e in events(d, "lease.expired") if e["job"] == job]
    assert exp["token"].split(".")[0] == first["token"].split(".")[0]
    # the ignored limit is still reported once, not every pass
    assert len([e for e in events(d, "limit.ignored") if e["key"] == "executor.toleration_seconds"]) == 1
    a.resume()
    b.kill()


def test_a_server_restarted_with_a_shorter_toleration_is_fenced_by_at_the_next_heartbeat(
    redis_server, namespace, workers, tmp_path
):
    """config.toml's toleration cut from 12 s to 6 s across a restart: the worker, registered under 12 s, fences by
    6 s from the first heartbeat the restarted server renews (its answer names the timings), so the job that the
    engine now expires at 6 s is dead by then, and its second run never overlaps the first."""
    marker = tmp_path / "marker"
    d = tcp_server(redis_server.url, namespace, config=FAST_EXECUTOR.replace("toleration_seconds = 6", LONG))
    try:
        a = workers(d, token(d, "wa")).start()
        job = marker_job(d, marker, seconds=2, first_forever=True)
        first = _running(marker, job, 1)
        state(d, job, "running")
        (slot,) = slot_dirs(a.home / "work" / "wa")
        ahead = lambda: (slot_deadline(slot) or 0.0) - clock.now()  # noqa: E731
        wait_for(lambda: ahead() > TOLERATION, 10, interval=0.05, what="a deadline under the 12 s toleration")
        d.stop()
        conf = d.home / "config.toml"
        conf.write_text(conf.read_text().replace(LONG, "toleration_seconds = 6"))
        d.start(listen=d.listen)
        # the first renewal by the restarted server brings the deadline within 6 − 1 s of its send
        wait_for(lambda: ahead() <= FENCE_AFTER, 10, interval=0.05, what="the worker to fence by the new toleration")
        a.pause()
        b = workers(d, token(d, "wb")).start()
        second = _running(marker, job, 2, timeout=TOLERATION + 20)
        runs = marker_runs(marker)[job]
        assert [r["where"] for r in runs[:2]] == ["wa", "wb"] and not overlapping(runs), runs
        assert runs[0]["last"] < second["start"], (first, second)
        a.resume()
        b.kill()
    finally:
        d.cleanup()
        kill_tree_of(str(d.home))


LONG = "toleration_seconds = 12"
