"""The machine sleeps, seen from the lease scripts on a real redis-server: while the daemon is away (no pass for
longer than grace) Redis expires lease keys on its own clock. A heartbeat or a report that reaches the API before
the daemon's first pass must find the lease as that pass will leave it (re-armed), not lost."""

from __future__ import annotations

import pytest

from piloop_common.protocol.operator import JobResult
from piloop_common.protocol.worker import PROTOCOL
from piloop_server.state.generation import GenerationRecord, ensure_generation
from piloop_server.state.keys import Keys
from piloop_server.state.leases import LeasesState
from piloop_server.state.records.lease import Lease, Timings
from tests.helpers.redis import wait_for

GRACE_MS, TOLERATION_MS = 400, 1200


@pytest.fixture
def leases(redis_client, namespace, tmp_path):
    keys = Keys(namespace)
    ensure_generation(redis_client, keys, GenerationRecord(tmp_path / "gen.json"), 0)
    return LeasesState(redis_client, keys, Timings(grace_ms=GRACE_MS, toleration_ms=TOLERATION_MS, max_lost=3))


def _leased(leases: LeasesState, job: str) -> Lease:
    leases.register("w1", "p", "", "cas1", {}, protocol=PROTOCOL, by="worker:w1")
    leases.enqueue(job, "evaluation", "p", {"argv": ["true"]}, by="human:t")
    (lease,) = leases.claim("w1", "p", "evaluation", slots=1, image="").leases
    assert not leases.expire().rearmed  # the daemon's pass ran once: it is present
    # then it is away (the machine sleeps): no pass runs while Redis expires the lease key on its own clock
    wait_for(
        lambda: not leases.r.exists(leases.k.lease(job)),
        TOLERATION_MS / 1000 + 2,
        interval=0.05,
        what="Redis to expire the lease key",
    )
    return lease


def test_a_heartbeat_before_the_first_pass_after_an_absence_keeps_the_lease(leases):
    lease = _leased(leases, "j1")
    _, st = leases.heartbeat("w1", {}, [lease])
    assert st["j1"] == "ok"
    assert leases.r.get(leases.k.lease("j1")).decode() == lease.token
    _, st = leases.heartbeat("w1", {}, [Lease("j1", "999")])
    assert st == {"j1": "lost"}  # a token the job does not hold is still lost
    exp = leases.expire()  # the daemon's first pass: its absence re-arms, nothing expires
    assert exp.rearmed and leases.r.hget(leases.k.job("j1"), "state") == b"running"


def test_a_report_before_the_first_pass_after_an_absence_is_on_time(leases):
    lease = _leased(leases, "j2")
    answer = leases.report("r2", "j2", lease.token, "w1", "succeeded", JobResult(exit_code=0))
    assert answer == {"answer": "accepted", "state": "succeeded"}
    assert not leases.r.exists(leases.k.lease("j2"))
    leases.expire()  # re-arms nothing for a finished job
    assert not leases.r.exists(leases.k.lease("j2")) and leases.r.hget(leases.k.job("j2"), "state") == b"succeeded"


def test_with_the_daemon_present_an_expired_lease_is_lost_and_a_late_report_stale(leases):
    leases.register("w1", "p", "", "cas1", {}, protocol=PROTOCOL, by="worker:w1")
    leases.enqueue("j3", "evaluation", "p", {"argv": ["true"]}, by="human:t")
    (lease,) = leases.claim("w1", "p", "evaluation", slots=1, image="").leases

    def expired() -> bool:  # the pass keeps running: present, so the lease expires and the job is queued again
        leases.expire()
        return leases.r.hget(leases.k.job("j3"), "state") == b"queued"

    wait_for(expired, TOLERATION_MS / 1000 + 2, interval=0.1, what="the pass to expire the lease")
    assert leases.heartbeat("w1", {}, [lease])[1] == {"j3": "lost"}
    assert leases.report("r3", "j3", lease.token, "w1", "fenced", JobResult())["answer"] == "stale"
