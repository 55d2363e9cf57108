"""A job's priority, countdown and expiry in the lease scripts, on a real redis-server (include/timing.lua,
include/expiry.lua): claims take 9 first and FIFO within one, a countdown waits in `delayed`, an expiry ends a job
never leased where a claim meets it and in the pass, and never one that started."""

from __future__ import annotations

import pytest

from piloop_server.state.generation import GenerationRecord, ensure_generation
from piloop_server.state.keys import Keys
from piloop_server.state.leases import LeasesState
from piloop_server.state.records.job import queued_at
from piloop_server.state.records.lease import Timings
from tests.helpers.redis import wait_for


@pytest.fixture
def leases(redis_client, namespace, tmp_path):
    keys = Keys(namespace)
    ensure_generation(redis_client, keys, GenerationRecord(tmp_path / "gen.json"), 0)
    lz = LeasesState(redis_client, keys, Timings(grace_ms=400, toleration_ms=1200, max_lost=2))
    lz.register("w1", "p", "", "cas1", {"load": 0.1}, protocol=1, by="worker:w1")
    return lz


def _state(leases: LeasesState, job: str) -> str:
    return leases.r.hget(leases.k.job(job), "state").decode()


def _redis_ms(leases: LeasesState) -> int:
    s, us = leases.r.time()
    return s * 1000 + us // 1000


def _claim(leases: LeasesState, most: int = 1) -> list[str]:
    return [lease.job for lease in leases.claim("w1", "p", "evaluation", slots=10, image="", most=most).leases]


def _enqueue(leases: LeasesState, job: str, now_ms: int | None = None, **spec) -> int:
    return leases.enqueue(job, "evaluation", "p", {"argv": ["true"], **spec}, by="human:t", now_ms=now_ms)


def test_claims_take_the_highest_priority_first_fifo_within_one_and_a_requeued_job_keeps_its_place(leases):
    plan = [("low", 0), ("high", 9), ("mid1", 5), ("mid2", 5), ("low2", 0)]
    at = {}
    t0 = _redis_ms(leases)
    for i, (job, priority) in enumerate(plan):
        at[job] = _enqueue(leases, job, now_ms=t0 + i, priority=priority)  # FIFO within a priority is by the time
    scores = dict(
        (j.decode(), s) for j, s in leases.r.zrange(leases.k.queue("p", "evaluation"), 0, -1, withscores=True)
    )
    assert all(queued_at(scores[j]) == at[j] for j in at), (scores, at)  # the time is kept under the priority
    first = _claim(leases)
    assert first == ["high"]
    token = leases.r.hget(leases.k.job("high"), "token").decode()
    leases.release("high", token, "w1", "given back")  # back at its old place: first again
    assert _claim(leases, most=5) == ["high", "mid1", "mid2", "low", "low2"]


def test_a_countdown_waits_in_delayed_and_the_pass_queues_it_when_its_time_comes(leases):
    queued = _enqueue(leases, "later", countdown_seconds=0.3)
    _enqueue(leases, "now")
    assert _claim(leases, most=5) == ["now"]  # `later` is not in its queue yet
    not_before = int(leases.r.hget(leases.k.job("later"), "not_before"))
    assert not_before == queued + 300 and _state(leases, "later") == "queued"
    wait_for(lambda: leases.due() == 1, 5, what="the countdown to pass")
    assert _redis_ms(leases) >= not_before
    assert _claim(leases) == ["later"]
    assert leases.r.hget(leases.k.job("later"), "not_before") is None


def test_a_claim_ends_an_expired_job_instead_of_leasing_it_late(leases):
    t0 = _redis_ms(leases)
    _enqueue(leases, "stale", now_ms=t0, expires_seconds=0.2)  # first in line
    _enqueue(leases, "fresh", now_ms=t0 + 1)
    expires = int(leases.r.hget(leases.k.job("stale"), "expires"))
    wait_for(lambda: _redis_ms(leases) > expires, 5, what="Redis's clock past the expiry")
    assert _claim(leases) == ["fresh"]  # the expired head is ended, and the claim goes on to the next
    assert _state(leases, "stale") == "expired"
    assert leases.r.zscore(leases.k.expiring(), "stale") is None
    assert leases.r.zscore(leases.k.queue("p", "evaluation"), "stale") is None
    assert leases.r.zscore(leases.k.ended(), "stale") is not None  # retention sees it
    assert leases.claim("w1", "p", "evaluation", slots=10, image="").reason == "nothing"


def test_the_pass_ends_an_expired_job_that_no_worker_asked_for(leases):
    _enqueue(leases, "alone", expires_seconds=0.2)
    assert leases.expire_unstarted() == 0 and _state(leases, "alone") == "queued"
    wait_for(lambda: leases.expire_unstarted() == 1, 5, what="the pass to expire it")
    assert _state(leases, "alone") == "expired"
    reason = leases.r.hget(leases.k.job("alone"), "reason").decode()
    assert reason.startswith("expired: not started within 0.2 s"), reason
    assert leases.expire_unstarted() == 0  # idempotent: a second daemon's pass changes nothing


def test_a_job_that_started_is_never_expired(leases):
    _enqueue(leases, "begun", expires_seconds=0.3)
    assert _claim(leases) == ["begun"]
    assert leases.r.hget(leases.k.job("begun"), "expires") is None
    token = leases.r.hget(leases.k.job("begun"), "token").decode()
    leases.release("begun", token, "w1", "given back")
    wait_for(lambda: _redis_ms(leases) > int(leases.r.hget(leases.k.job("begun"), "created")) + 300, 5)
    assert leases.expire_unstarted() == 0
    assert _claim(leases) == ["begun"]


def test_enqueue_many_queues_each_as_enqueue_does_and_refuses_an_id_that_exists(leases):
    from piloop_common.errors import Conflict

    _enqueue(leases, "j0")
    got = leases.enqueue_many(
        [("j1", {"argv": ["true"]}), ("j0", {"argv": ["true"]}), ("j2", {"argv": ["true"], "countdown_seconds": 60})],
        "evaluation",
        "p",
        by="human:t",
    )
    assert isinstance(got[1], Conflict) and all(isinstance(g, int) for g in (got[0], got[2])), got
    assert _state(leases, "j1") == _state(leases, "j2") == "queued"
    assert leases.r.zscore(leases.k.delayed(), "j2") is not None  # its countdown: in `delayed`, not the queue
    assert _claim(leases, most=5) == ["j0", "j1"]
