"""The lease scripts on a real redis-server: claim, heartbeat, release, report, expiry."""

from __future__ import annotations

import base64
import json
import time

import pytest

from piloop_common.bytecaps import INLINE_MAX_BYTES
from piloop_common.errors import BadRequest, LeaseLost, NotFound, TooLarge
from piloop_common.protocol.operator import JobResult
from piloop_server.state.generation import GenerationRecord, ensure_generation
from piloop_server.state.keys import Keys
from piloop_server.state.leases import LeasesState
from piloop_server.state.records.lease import Lease, Report, Timings, fence
from piloop_server.state.retention import Horizons, RetentionState
from tests.helpers.redis import wait_for


@pytest.fixture
def leases(redis_client, namespace, tmp_path):
    keys = Keys(namespace)
    ensure_generation(redis_client, keys, GenerationRecord(tmp_path / "gen.json"), 0)
    return LeasesState(redis_client, keys, Timings(grace_ms=400, toleration_ms=1200, max_lost=2))


def _worker(leases: LeasesState, name: str = "w1", pool: str = "p", image: str = "") -> None:
    leases.register(name, pool, image, "cas1", {"load": 0.1}, protocol=1, by=f"worker:{name}")


def _s(b: bytes | str) -> str:
    return b.decode() if isinstance(b, bytes) else b


def _state(leases: LeasesState, job: str) -> str:
    return leases.r.hget(leases.k.job(job), "state").decode()


def _redis_ms(leases: LeasesState) -> int:
    s, us = leases.r.time()
    return s * 1000 + us // 1000


def test_claim_takes_oldest_first_and_respects_slots(leases):
    _worker(leases)
    t0 = _redis_ms(leases)
    for i in range(3):
        leases.enqueue(f"j{i}", "evaluation", "p", {"argv": ["true"]}, by="human:t", now_ms=t0 + i)
    c = leases.claim("w1", "p", "evaluation", slots=2, image="", most=5)
    assert [lease.job for lease in c.leases] == ["j0", "j1"]
    assert fence(c.leases[1].token) > fence(c.leases[0].token)
    again = leases.claim("w1", "p", "evaluation", slots=2, image="", most=5)
    assert again.leases == [] and again.reason == "slots"
    assert _state(leases, "j0") == "leased"


def test_claim_reads_past_jobs_it_may_not_run_in_pages_and_keeps_their_order(leases):
    """The claim reads the queue as deep as it needs (as many as it wants, then pages of 16): the jobs it cannot run
    (another image, a grant past the worker's room) stay queued in order, and the ones it leases do not make it skip
    any (a lease moves the rest of the queue up)."""
    _worker(leases, image="img:1")
    other = [f"x{i}" for i in range(3)] + [f"y{i}" for i in range(14)]  # for another image's workers
    plan = [(f"a{i}", "", 0) for i in range(3)] + [(x, "img:2", 0) for x in other[:3]]  # the first read: 6
    plan += [(f"b{i}", "img:1", 100) for i in range(2)] + [(y, "img:2", 0) for y in other[3:]]  # the next 16
    plan += [(f"big{i}", "", 4096) for i in range(2)] + [(f"c{i}", "", 0) for i in range(3)]
    t0 = _redis_ms(leases)
    for i, (job, image, mb) in enumerate(plan):
        spec = {"argv": ["true"], **({"memory_mb": mb} if mb else {})}
        leases.enqueue(job, "evaluation", "p", spec, by="human:t", image=image, now_ms=t0 + i)
    c = leases.claim("w1", "p", "evaluation", slots=10, image="img:1", most=6, room_mb=1024)
    assert [lease.job for lease in c.leases] == ["a0", "a1", "a2", "b0", "b1", "c0"]
    c = leases.claim("w1", "p", "evaluation", slots=10, image="img:1", most=6, room_mb=1024)
    assert [lease.job for lease in c.leases] == ["c1", "c2"]
    queued = [_s(j) for j in leases.r.zrange(leases.k.queue("p", "evaluation"), 0, -1)]
    assert queued == [*other, "big0", "big1"]
    assert leases.claim("w1", "p", "evaluation", slots=10, image="img:1", most=6, room_mb=1024).reason == "memory"
    assert leases.claim("w1", "p", "evaluation", slots=10, image="", most=0).reason == "slots"  # none asked for
    _worker(leases, name="w2", image="img:2")
    c = leases.claim("w2", "p", "evaluation", slots=30, image="img:2", most=30, room_mb=1024)
    assert [lease.job for lease in c.leases] == other


def test_claim_reasons(leases):
    _worker(leases, image="img:1")
    assert leases.claim("w1", "p", "evaluation", slots=1, image="img:1").reason == "nothing"
    leases.enqueue("j", "evaluation", "p", {}, by="human:t", image="img:2")
    assert leases.claim("w1", "p", "evaluation", slots=1, image="img:1").reason == "image"
    leases.r.hset(leases.k.worker("w1"), "draining", "1")
    assert leases.claim("w1", "p", "evaluation", slots=1, image="img:2").reason == "draining"
    leases.r.hset(leases.k.worker("w1"), "draining", "0")
    leases.r.delete(leases.k.worker_alive("w1"))
    assert leases.claim("w1", "p", "evaluation", slots=1, image="img:2").reason == "unreachable"


def test_agents_go_to_the_campaign_with_fewest_live(leases):
    _worker(leases)
    _worker(leases, "w2")
    t0 = _redis_ms(leases)
    leases.enqueue("a1", "agent", "p", {}, by="human:t", campaign="big", now_ms=t0)
    leases.enqueue("a2", "agent", "p", {}, by="human:t", campaign="big", now_ms=t0 + 1)
    leases.enqueue("b1", "agent", "p", {}, by="human:t", campaign="small", now_ms=t0 + 2)
    first = leases.claim("w1", "p", "agent", slots=1, image="")
    assert [lease.job for lease in first.leases] == ["a1"]
    # big now has one live agent, small none: small's job goes first though it is newer
    second = leases.claim("w2", "p", "agent", slots=1, image="")
    assert [lease.job for lease in second.leases] == ["b1"]


def test_heartbeat_renews_marks_running_and_reports_lost(leases):
    _worker(leases)
    leases.enqueue("j", "evaluation", "p", {}, by="human:t")
    (lease,) = leases.claim("w1", "p", "evaluation", slots=1, image="").leases
    _, st = leases.heartbeat("w1", {}, [lease, Lease("ghost", "1")])
    assert st == {"j": "ok", "ghost": "lost"}
    assert _state(leases, "j") == "running"
    _, st = leases.heartbeat("w1", {}, [Lease("j", "999")])
    assert st == {"j": "lost"}


def test_heartbeat_from_unknown_worker_must_register(leases):
    with pytest.raises(NotFound):
        leases.heartbeat("nobody", {}, [])


def test_release_puts_back_without_an_attempt(leases):
    _worker(leases)
    leases.enqueue("j", "evaluation", "p", {}, by="human:t")
    (lease,) = leases.claim("w1", "p", "evaluation", slots=1, image="").leases
    with pytest.raises(LeaseLost):
        leases.release("j", "123", "w1")
    leases.release("j", lease.token, "w1", "image")
    assert _state(leases, "j") == "queued"
    assert leases.r.hget(leases.k.job("j"), "attempts") == b"0"
    (again,) = leases.claim("w1", "p", "evaluation", slots=1, image="").leases
    assert fence(again.token) > fence(lease.token)


def test_report_is_idempotent_and_stale_reports_are_kept(leases):
    _worker(leases)
    leases.enqueue("j", "evaluation", "p", {}, by="human:t")
    (lease,) = leases.claim("w1", "p", "evaluation", slots=1, image="").leases
    a = leases.report("r1", "j", lease.token, "w1", "succeeded", JobResult(exit_code=0))
    b = leases.report("r1", "j", lease.token, "w1", "succeeded", JobResult(exit_code=0))
    assert a == b == {"answer": "accepted", "state": "succeeded"}
    assert leases.r.hget(leases.k.job("j"), "attempts") == b"1"
    stale = leases.report("r2", "j", lease.token, "w1", "failed", JobResult(exit_code=1))
    assert stale == {"answer": "stale"}
    events = [e[1] for e in leases.r.xrange(leases.k.events())]
    assert any(e[b"type"] == b"lease.stale_report" and e[b"job"] == b"j" for e in events)
    assert _state(leases, "j") == "succeeded"


def test_report_lua_refuses_inline_outputs_over_the_cap_and_changes_nothing(leases):
    """The state facade's own check (report.lua): an inline result over INLINE_MAX_BYTES, or named in outputs too,
    is refused for that report alone, which changes nothing; the others of its batch stand."""

    _worker(leases)
    for j in ("a", "b"):
        leases.enqueue(j, "evaluation", "p", {}, by="human:t")
    la, lb = leases.claim("w1", "p", "evaluation", slots=2, image="", most=2).leases
    over = base64.b64encode(b"x" * (INLINE_MAX_BYTES + 1)).decode()
    small = base64.b64encode(b'{"value": 1}').decode()
    before = leases.r.hgetall(leases.k.job("a"))
    got = leases.report_many(
        [
            Report("ra", "a", la.token, "w1", "succeeded", JobResult(inline_outputs={"result.json": over})),
            Report(
                "ra2",
                "a",
                la.token,
                "w1",
                "succeeded",
                JobResult(inline_outputs={"result.json": small}, outputs={"result.json": "sha256:" + "ab" * 32}),
            ),
            Report("rb", "b", lb.token, "w1", "succeeded", JobResult(inline_outputs={"result.json": small})),
        ]
    )
    assert isinstance(got[0], TooLarge) and "over 65536" in got[0].message
    assert isinstance(got[1], BadRequest) and "both inline and a CAS address" in got[1].message
    assert got[2] == {"answer": "accepted", "state": "succeeded"}
    assert leases.r.hgetall(leases.k.job("a")) == before and leases.r.get(leases.k.lease("a")) is not None
    assert json.loads(leases.r.hget(leases.k.job("b"), "result"))["inline_outputs"] == {"result.json": small}


def test_a_batch_of_reports_is_one_script_call(leases):
    """report_many runs every report of the batch in one EVALSHA (report.lua takes n reports), each answered as if
    alone: a copy in the same batch gets the first's answer."""
    _worker(leases)
    for j in ("a", "b", "c"):
        leases.enqueue(j, "evaluation", "p", {}, by="human:t")
    la, lb, lc = leases.claim("w1", "p", "evaluation", slots=3, image="", most=3).leases
    assert leases.report("ra", "a", la.token, "w1", "succeeded", JobResult())["answer"] == "accepted"  # SHA known

    def evalsha_calls() -> int:
        return int(leases.r.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))

    before = evalsha_calls()
    got = leases.report_many(
        [
            Report("rb", "b", lb.token, "w1", "succeeded", JobResult(exit_code=0)),
            Report("rc", "c", lc.token, "w1", "failed", JobResult(exit_code=1), "boom"),
            Report("rb", "b", lb.token, "w1", "succeeded", JobResult(exit_code=0)),
            Report("ra", "a", la.token, "w1", "succeeded", JobResult()),
        ]
    )
    assert evalsha_calls() - before == 1
    assert got[0] == got[2] == {"answer": "accepted", "state": "succeeded"}
    assert got[1] == {"answer": "accepted", "state": "failed"}
    assert got[3] == {"answer": "accepted", "state": "succeeded"}  # a's copy: its first answer


def test_a_reports_answer_is_kept_in_its_job_and_goes_with_it(leases):
    """Each lease's answer is a field of the job's hash: a copy of an earlier attempt's report still gets its answer
    after the next lease was taken; once the job is removed, a copy is answered that the job does not exist, and
    nothing of the report is left in Redis."""
    _worker(leases)
    leases.enqueue("j", "evaluation", "p", {"argv": ["x"], "max_attempts": 2, "backoff_seconds": 0}, by="human:t")
    (one,) = leases.claim("w1", "p", "evaluation", slots=1, image="").leases
    failed = leases.report("r1", "j", one.token, "w1", "failed", JobResult(exit_code=1))
    assert failed == {"answer": "accepted", "state": "queued"}
    leases.due()
    (two,) = leases.claim("w1", "p", "evaluation", slots=1, image="").leases
    assert leases.report("r1", "j", one.token, "w1", "failed", JobResult(exit_code=1)) == failed  # the first answer
    done = leases.report("r2", "j", two.token, "w1", "succeeded", JobResult(exit_code=0))
    assert done == {"answer": "accepted", "state": "succeeded"}
    assert leases.report("r2", "j", two.token, "w1", "succeeded", JobResult(exit_code=0)) == done
    kept = {f.decode() for f in leases.r.hkeys(leases.k.job("j")) if f.startswith(b"answer:")}
    assert kept == {f"answer:{one.token}", f"answer:{two.token}"}
    # a stale report under an older token is not kept: it is stale again at every copy
    assert leases.report("r3", "j", one.token, "w1", "succeeded", JobResult())["answer"] == "stale"
    assert len([f for f in leases.r.hkeys(leases.k.job("j")) if f.startswith(b"answer:")]) == 2
    time.sleep(0.01)
    assert RetentionState(leases.r, leases.k).prune(Horizons(1, 1)).removed == 1
    # the job gone, a copy of its report (a worker's spool, sent late) is stale and makes nothing again
    assert leases.report("r2", "j", two.token, "w1", "succeeded", JobResult(exit_code=0)) == {"answer": "stale"}
    left = [
        k.decode() for k in leases.r.scan_iter(match=leases.k.prefix().replace("{", "\\{").replace("}", "\\}") + "*")
    ]
    assert not [k for k in left if "j" in k.removeprefix(leases.k.prefix()).split(":")], left


def test_reports_in_one_batch_answer_each_in_order_and_one_error_leaves_the_others(leases):
    _worker(leases)
    t0 = _redis_ms(leases)
    for i, j in enumerate(("c", "a", "b")):
        leases.enqueue(j, "evaluation", "p", {}, by="human:t", now_ms=t0 + i)
    lc, la, lb = leases.claim("w1", "p", "evaluation", slots=3, image="", most=3).leases
    assert (
        leases.report("rc", "c", lc.token, "w1", "succeeded", JobResult())["answer"] == "accepted"
    )  # its SHA now known
    leases.r.script_flush()  # as after a restart of Redis: every script of the batch meets NOSCRIPT, and runs once
    over = base64.b64encode(b"x" * (INLINE_MAX_BYTES + 1)).decode()
    got = leases.report_many(
        [
            Report("ra", "a", la.token, "w1", "succeeded", JobResult(exit_code=0)),
            Report(
                "rx", "a", la.token, "w1", "succeeded", JobResult(inline_outputs={"result.json": over})
            ),  # refused alone: over the inline cap
            Report("rn", "nope", "1", "w1", "succeeded", JobResult()),  # a job that does not exist: stale
            Report(
                "ra", "a", la.token, "w1", "succeeded", JobResult(exit_code=0)
            ),  # the same report again: the same answer
            Report(
                "rb", "b", lb.token[:-1] + ("0" if lb.token[-1] != "0" else "1"), "w1", "failed", JobResult(exit_code=1)
            ),  # not b's lease
            Report("rb2", "b", lb.token, "w1", "failed", JobResult(exit_code=1), "boom"),
        ]
    )
    assert got[0] == got[3] == {"answer": "accepted", "state": "succeeded"}
    assert isinstance(got[1], TooLarge) and "over 65536" in got[1].message
    assert got[2] == got[4] == {"answer": "stale"}
    assert got[5]["answer"] == "accepted"
    assert _state(leases, "a") == "succeeded" and _state(leases, "b") == got[5]["state"]
    assert not leases.r.exists(leases.k.job("nope"))
    assert leases.r.hget(leases.k.job("a"), "attempts") == b"1"


def test_expiry_requeues_evaluations_ends_agents_and_stops_after_max_lost(leases):
    _worker(leases)
    leases.enqueue("e", "evaluation", "p", {}, by="human:t")
    leases.enqueue("a", "agent", "p", {}, by="human:t", campaign="c")
    leases.expire()  # the first pass marks the daemon present
    (le,) = leases.claim("w1", "p", "evaluation", slots=1, image="").leases
    (la,) = leases.claim("w1", "p", "agent", slots=1, image="").leases

    def pass_expired(n: int):
        def go():
            leases.heartbeat("w1", {}, [])  # the worker lives; its leases are not named
            return leases.expire().count >= n or None

        return go

    wait_for(pass_expired(1), 5, interval=0.1, what="the leases to expire")
    wait_for(lambda: _state(leases, "a") == "worker_lost" or (leases.expire() and False), 5, what="agent lost")
    assert _state(leases, "e") == "queued"
    assert leases.r.hget(leases.k.campaign_live(), "c") == b"0"
    # a late report under the old token is stale
    assert leases.report("late", "e", le.token, "w1", "succeeded", JobResult())["answer"] == "stale"
    # the second loss in a row ends it lost (max_lost = 2)
    (le2,) = leases.claim("w1", "p", "evaluation", slots=1, image="").leases
    assert fence(le2.token) > fence(le.token)

    def lost():
        leases.heartbeat("w1", {}, [])
        res = leases.expire()
        return "e" in res.lost or None

    wait_for(lost, 5, interval=0.1, what="the evaluation to end lost")
    assert _state(leases, "e") == "lost"
    del la


def test_daemon_absence_rearms_instead_of_expiring(leases):
    _worker(leases)
    leases.enqueue("e", "evaluation", "p", {}, by="human:t")
    leases.expire()
    (lease,) = leases.claim("w1", "p", "evaluation", slots=1, image="").leases
    # the daemon is away longer than both grace (0.4 s) and toleration (1.2 s): its lease key is gone
    wait_for(lambda: not leases.r.exists(leases.k.lease("e")), 5, what="the lease key to expire")
    res = leases.expire()
    assert res.rearmed and res.count == 1
    assert leases.r.get(leases.k.lease("e")).decode() == lease.token
    assert leases.r.exists(leases.k.worker_alive("w1"))
    _, st = leases.heartbeat("w1", {}, [lease])
    assert st == {"e": "ok"}


def test_held_pools_do_not_requeue(leases):
    _worker(leases)
    leases.enqueue("e", "evaluation", "p", {}, by="human:t")
    leases.expire()
    leases.claim("w1", "p", "evaluation", slots=1, image="")

    def due():
        leases.heartbeat("w1", {}, [])
        leases.expire(held_pools=("p",))
        return not leases.r.exists(leases.k.lease("e"))

    wait_for(due, 5, interval=0.1, what="the lease to lapse")
    leases.heartbeat("w1", {}, [])
    assert leases.expire(held_pools=("p",)).count == 0
    assert _state(leases, "e") == "running" or _state(leases, "e") == "leased"


def test_pool_silence_counts_each_pools_workers_and_the_silent_ones(leases):
    assert leases.pool_silence() == {}
    for name, pool in (("a1", "p"), ("a2", "p"), ("a3", "p"), ("g1", "gpu")):
        _worker(leases, name, pool)
    leases.r.delete(leases.k.worker_alive("a2"), leases.k.worker_alive("g1"))
    assert leases.pool_silence() == {"p": (3, 1), "gpu": (1, 1)}


def test_generation_change_keeps_tokens_growing(redis_client, namespace, tmp_path):
    keys = Keys(namespace)
    rec = GenerationRecord(tmp_path / "gen.json")
    g1 = ensure_generation(redis_client, keys, rec, 0)
    assert not g1.lost_data
    lz = LeasesState(redis_client, keys, Timings(400, 1200))
    _worker(lz)
    lz.enqueue("e", "evaluation", "p", {}, by="human:t")
    (before,) = lz.claim("w1", "p", "evaluation", slots=1, image="").leases
    for key in redis_client.scan_iter(match=keys.prefix() + "*"):
        redis_client.delete(key)  # Redis lost its data
    g2 = ensure_generation(redis_client, keys, rec, 300)
    assert g2.lost_data and g2.generation == g1.generation + 1
    _worker(lz)
    lz.enqueue("e2", "evaluation", "p", {}, by="human:t")
    assert lz.claim("w1", "p", "evaluation", slots=1, image="").reason == "recovering"
    redis_client.hset(keys.daemon(), "hold_until", 0)
    (after,) = lz.claim("w1", "p", "evaluation", slots=1, image="").leases
    assert fence(after.token) > fence(before.token)
