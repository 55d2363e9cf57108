"""The pass leader's lease and the fence its scripts check, on a real redis-server (state/leader.py,
scripts/include/fence.lua, piloop_server/leader.py)."""

from __future__ import annotations

import time

import pytest

from piloop_common.config.settings import ExecutorConfig
from piloop_server.daemon import disruption_policy
from piloop_server.leader import RENEWALS_PER_TTL, Leadership
from piloop_server.state.disruption import DisruptionState
from piloop_server.state.generation import GenerationRecord, ensure_generation
from piloop_server.state.keys import Keys
from piloop_server.state.leader import LeaderLease
from piloop_server.state.leases import LeasesState
from piloop_server.state.records.lease import Timings
from piloop_server.state.retention import Horizons, RetentionState
from piloop_server.state.scripts import Fenced, fenced
from tests.helpers.redis import wait_for

# every script the pass runs that changes state; the fence include must stay in each
PASS_SCRIPTS = ("expire", "due", "unstarted", "dependencies", "schedule_tick", "disruption", "prune", "forget_worker")


def _events(r, keys: Keys, etype: str) -> list[dict[str, str]]:
    out = []
    for _, f in r.xrange(keys.events()):
        d = {k.decode(): v.decode() for k, v in f.items()}
        if d["type"] == etype:
            out.append(d)
    return out


@pytest.fixture
def keys(redis_client, namespace, tmp_path) -> Keys:
    k = Keys(namespace)
    ensure_generation(redis_client, k, GenerationRecord(tmp_path / "gen.json"), 0)
    return k


def test_the_pass_scripts_include_the_fence_and_the_others_do_not():
    assert all(fenced(n) for n in PASS_SCRIPTS)
    assert not any(fenced(n) for n in ("claim", "report", "heartbeat", "enqueue", "leader"))


def test_one_server_holds_the_lease_renews_it_and_a_lapsed_one_goes_to_another_under_a_higher_token(redis_client, keys):
    a, b = LeaderLease(redis_client, keys, "a"), LeaderLease(redis_client, keys, "b")
    got = a.hold("", 300)
    assert got.leading and got.holder == "a"
    other = b.hold("", 300)
    assert not other.leading and other.holder == "a"
    assert a.hold(got.token, 300).token == got.token  # a renewal keeps the token
    assert 0 < redis_client.pttl(keys.leader()) <= 300
    assert a.hold("", 300).token == ""  # the holder's name without its token takes nothing
    wait_for(lambda: not redis_client.exists(keys.leader()), timeout=3, what="the unrenewed lease to lapse")
    took = b.hold("", 300)
    assert took.leading and int(took.token) > int(got.token)
    assert not a.hold(got.token, 300).leading  # the old leader's renewal under its old token fails
    assert b.current().token == took.token and b.current().holder == "b"
    assert [(e["server"], e["token"]) for e in _events(redis_client, keys, "pass.leader")] == [
        ("a", got.token),
        ("b", took.token),
    ]
    b.resign(took.token)
    assert not redis_client.exists(keys.leader())
    with pytest.raises(ValueError, match="TTL"):
        a.hold("", 0)


def test_a_stale_token_changes_nothing_and_the_leaders_expires_the_lease(redis_client, keys):
    leases = LeasesState(redis_client, keys, Timings(grace_ms=400, toleration_ms=1200, max_lost=3))
    leases.register("w1", "p", "", "cas1", {"load": 0.1}, protocol=1, by="worker:w1")
    leases.enqueue("j1", "evaluation", "p", {"argv": ["true"]}, by="human:t")
    assert leases.claim("w1", "p", "evaluation", slots=1, image="", most=1).leases
    redis_client.delete(keys.lease("j1"))  # the toleration stage is over: the next pass expires it
    redis_client.zadd(keys.deadlines(), {"j1": 0})
    lease = LeaderLease(redis_client, keys, "old")
    old = lease.hold("", 200)
    wait_for(lambda: not redis_client.exists(keys.leader()), timeout=3, what="the old lease to lapse")
    new = LeaderLease(redis_client, keys, "new").hold("", 5000)
    before = redis_client.hgetall(keys.daemon())
    with pytest.raises(Fenced, match=f"token {old.token} no longer leads"):
        leases.expire((), lease.fence(old.token))
    assert redis_client.hget(keys.job("j1"), "state") == b"leased"  # nothing written, not even last_pass
    assert redis_client.hgetall(keys.daemon()) == before
    assert _events(redis_client, keys, "lease.expired") == []
    res = leases.expire((), lease.fence(new.token))
    assert res.count == 1 and redis_client.hget(keys.job("j1"), "state") == b"queued"


def test_every_pass_script_refuses_a_stale_token(redis_client, keys):
    stale = LeaderLease(redis_client, keys, "old").fence("1")
    new = LeaderLease(redis_client, keys, "new")
    new.resign(new.hold("", 5000).token)  # token 1 was given, and given up
    assert new.hold("", 5000).token == "2"
    leases = LeasesState(redis_client, keys, Timings(grace_ms=400, toleration_ms=1200, max_lost=3))
    leases.register("w1", "p", "", "cas1", {"load": 0.1}, protocol=1, by="worker:w1")
    with pytest.raises(Fenced):
        leases.due(stale)
    with pytest.raises(Fenced):
        RetentionState(redis_client, keys).prune(Horizons(1, 1), fence=stale)
    dis = DisruptionState(redis_client, keys)
    with pytest.raises(Fenced):
        dis.decide(disruption_policy(ExecutorConfig()), stale)
    assert dis.forget(("w1",), "service:daemon", stale) == []  # refused: the worker stays
    assert redis_client.sismember(keys.workers(), "w1")


def test_a_follower_takes_a_lapsed_lease_within_a_third_of_its_ttl_and_the_old_one_knows_by_its_clock(
    redis_client, keys
):
    ttl = 0.6
    a = Leadership(LeaderLease(redis_client, keys, "a"), ttl)
    b = Leadership(LeaderLease(redis_client, keys, "b"), ttl)
    a.tick()
    b.tick()
    fa = a.fence()
    assert fa is not None and b.fence() is None
    # a stops renewing (stopped, or dead); b keeps trying at its period
    wait_for(lambda: a.fence() is None, timeout=ttl * 2, what="a's lease to lapse by its own clock")
    lapsed = time.monotonic()
    while b.fence() is None:
        assert time.monotonic() - lapsed < ttl * 2, "b did not take the lapsed lease"
        b.tick()
        time.sleep(ttl / RENEWALS_PER_TTL)
    fb = b.fence()
    assert fb is not None and int(fb.token) > int(fa.token)
    a.tick()  # a wakes: its renewal is refused and it knows it follows
    assert a.token == "" and a.fence() is None
