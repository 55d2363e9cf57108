"""A worker's name belongs to the token that registered it (issue 46, item 2), attacked over real HTTP against a
real `piloop serve` with real tokens: a `--rename` token that names itself after a live worker cannot register,
beat, claim, report, release or log under that name; a pool-bound worker cannot be moved to another pool, at
register or at claim; and no role but the holder ever reads a lease token (job views, the CLI, events).
Each refused attempt leaves the namespace's keys as they were (jobs, leases, scores)."""

from __future__ import annotations

import json
import uuid

import httpx
import pytest
import redis

from piloop_common.errors import LeaseLost
from piloop_server.state.keys import Keys
from piloop_server.state.relay import RelayCaller, RelayState
from tests.helpers import adversary
from tests.helpers.adversary import LONG_TIMINGS, live_beats
from tests.helpers.workers import HandWorker, events, submit, token, view


class World:
    def __init__(self, d, r: redis.Redis, ns: str, workers: dict[str, HandWorker]) -> None:
        self.d, self.r, self.ns, self.workers = d, r, ns, workers

    @property
    def k(self) -> Keys:
        return Keys(self.ns)

    def volatile(self, key: str) -> bool:
        """What a live daemon rewrites whatever the attempt (the events stream is checked on its own)."""
        k = self.k
        beats = live_beats(k, self.workers) | {k.dependencies_cursor()}
        return key in beats or key.startswith(k.rq_prefix())


@pytest.fixture(scope="module")
def world(tcp_daemon):
    s = tcp_daemon(LONG_TIMINGS)
    made: dict[str, HandWorker] = {}
    try:
        made["gpua"] = HandWorker(s.d, "gpua", token(s.d, "gpua", "--pool", "gpu"), "gpu").register()
        yield World(s.d, s.r, s.ns, made)
    finally:
        for w in made.values():
            w.close()


def snapshot(w: World) -> dict[str, object]:
    return adversary.snapshot(w.r, w.k, w.volatile)


def renamed(d, tok: str, name: str, pool: str = "gpu") -> HandWorker:
    """A hand worker of `--rename` token `tok` that names itself `name` (x-piloop-worker)."""
    w = HandWorker(d, name, tok, pool)
    w.http.headers["x-piloop-worker"] = name
    return w


def leased(world: World) -> tuple[str, str]:
    job = submit(world.d, "true", pool="gpu")
    got = world.workers["gpua"].register().claim()  # registered again: a hand worker sends no heartbeat
    assert got["job"] == job, got
    return job, got["token"]


def test_a_rename_token_cannot_act_as_a_live_worker(world):
    job, lease = leased(world)
    thief = renamed(world.d, token(world.d, "fleet", "--pool", "gpu", "--rename"), "gpua")
    seen = len(events(world.d, "lease.foreign_token"))
    before = snapshot(world)
    owner_before = world.r.hgetall(world.k.worker("gpua"))
    rid = "r" + uuid.uuid4().hex[:12]
    try:
        reg = thief.post("register", thief.hello())
        assert reg.status_code == 403 and "worker name gpua is token gpua's" in reg.json()["message"], reg.text
        beat = thief.post("heartbeat", thief.hello([{"job": job, "token": lease}]))
        assert beat.status_code == 403 and "is held by another token" in beat.json()["message"], beat.text
        claim = thief.post("claim", {"want": {"evaluation": 1}})
        assert claim.status_code == 403 and "is held by another token" in claim.json()["message"], claim.text
        rep = thief.post(
            "report",
            {"report_id": rid, "job": job, "token": lease, "outcome": "succeeded", "exit_code": 0, "score": 1e9},
        )
        assert rep.status_code == 200 and rep.json()["answer"] == "stale", rep.text
        rel = thief.post("release", {"job": job, "token": lease, "reason": "stolen"})
        assert rel.status_code == 409 and rel.json()["error"] == "lease_lost", rel.text
        log = thief.post("log", {"job": job, "token": lease, "chunks": ["sha256:" + "ab" * 32]})
        assert log.status_code == 409 and log.json()["error"] == "lease_lost", log.text
    finally:
        thief.close()
    after = snapshot(world)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    assert not changed, changed
    rec = world.r.hgetall(world.k.worker("gpua"))
    assert rec[b"owner"] == owner_before[b"owner"] == b"token:gpua" and rec[b"pool"] == b"gpu", rec
    v = view(world.d, job)
    assert (v["state"], v["worker"]) == ("leased", "gpua") and not v["result"], v
    new = events(world.d, "lease.foreign_token")[seen:]
    assert {(e["job"], e["worker"]) for e in new} == {(job, "gpua")}, new  # the report, the release, the log
    # the holder's own calls still go through
    holder = world.workers["gpua"]
    beat = holder.post("heartbeat", holder.hello([{"job": job, "token": lease}]))
    assert beat.status_code == 200 and beat.json()["jobs"] == {job: "ok"}, beat.text
    assert holder.post("release", {"job": job, "token": lease, "reason": "done"}).status_code == 200
    world.d.cli("job", "cancel", job, check=True)


def test_a_rename_token_gets_its_own_names_only(world):
    tok = token(world.d, "fleet2", "--pool", "gpu", "--rename")
    token(world.d, "gpuz", "--pool", "gpu")  # a token of that name, its worker not started yet
    theirs = renamed(world.d, token(world.d, "fleet3", "--pool", "gpu", "--rename"), "fleet3-a")
    try:
        assert theirs.post("register", theirs.hello()).status_code == 200  # a live worker of another rename token
    finally:
        theirs.close()
    for name, why in (("gpuz", "is token gpuz's"), ("gpua", "is token gpua's"), ("fleet3-a", "is held by another")):
        w = renamed(world.d, tok, name)
        try:
            got = w.post("register", w.hello())
            assert got.status_code == 403 and why in got.json()["message"], (name, got.text)
        finally:
            w.close()
    assert not world.r.exists(world.k.worker("gpuz"))
    assert world.r.hget(world.k.worker("fleet3-a"), "owner") == b"token:fleet3"
    # a name of its own registers, and is its own again on the next register (a restart)
    own = renamed(world.d, tok, "fleet2-a")
    try:
        for _ in range(2):
            assert own.post("register", own.hello()).status_code == 200
        assert world.r.hget(world.k.worker("fleet2-a"), "owner") == b"token:fleet2"
    finally:
        own.close()


def test_a_pool_bound_worker_stays_in_its_pool(world):
    tok = token(world.d, "gpub", "--pool", "gpu")
    w = HandWorker(world.d, "gpub", tok, "gpu").register()
    try:
        before = world.r.hgetall(world.k.worker("gpub"))
        moved = HandWorker(world.d, "gpub", tok, "judge")
        try:
            got = moved.post("register", moved.hello())
            assert got.status_code == 403 and "is for pool gpu, not judge" in got.json()["message"], got.text
        finally:
            moved.close()
        # a rename token of the other pool cannot take the name into its pool either
        mine = renamed(world.d, token(world.d, "gpuf", "--pool", "gpu", "--rename"), "gpuf-1")
        judges = token(world.d, "judges", "--pool", "judge", "--rename")
        try:
            assert mine.post("register", mine.hello()).status_code == 200  # a pool-bound rename token's worker
            for name, why in (("gpub", "is token gpub's"), ("gpuf-1", "is held by another token")):
                other = renamed(world.d, judges, name, pool="judge")
                try:
                    got = other.post("register", other.hello())
                    assert got.status_code == 403 and why in got.json()["message"], got.text
                finally:
                    other.close()
        finally:
            mine.close()
        assert world.r.hget(world.k.worker("gpub"), "pool") == before[b"pool"] == b"gpu"
        assert world.r.hget(world.k.worker("gpuf-1"), "pool") == b"gpu"
        # a record that names another pool however it came to (an older server, a hand in Redis): the claim checks
        # the token's pool again, and a judge job stays queued
        job = submit(world.d, "true", pool="judge")
        world.r.hset(world.k.worker("gpub"), "pool", "judge")
        got = w.post("claim", {"want": {"evaluation": 1}})
        assert got.status_code == 403 and "is for pool gpu, not judge" in got.json()["message"], got.text
        assert view(world.d, job)["state"] == "queued"
        world.d.cli("job", "cancel", job, check=True)
    finally:
        world.r.hset(world.k.worker("gpub"), "pool", "gpu")
        w.close()


def test_no_role_reads_a_lease_token(world):
    job, lease = leased(world)
    secret = lease.partition(".")[2]
    assert len(secret) >= 32, lease
    bodies: list[str] = []
    for role in ("viewer", "operator", "admin"):
        tok = token(world.d, f"reader-{role}", "--role", role)
        with httpx.Client(base_url=world.d.url, headers={"Authorization": f"Bearer {tok}"}, timeout=10) as c:
            for path, params in (
                (f"/v1/jobs/{job}", {}),
                ("/v1/jobs", {}),
                ("/v1/events", {"after": "0", "count": 10_000}),
                ("/v1/workers", {}),
                ("/v1/status", {}),
            ):
                got = c.get(path, params=params)
                assert got.status_code == 200, (role, path, got.text)
                bodies.append(got.text)
    bodies.append(world.d.cli("job", "show", job, check=True).stdout)
    bodies.append(world.d.cli("job", "show", job, "--json", check=True).stdout)
    bodies.append(world.d.cli("job", "list", "--json", check=True).stdout)
    for body in bodies:
        assert lease not in body and secret not in body, body[:2000]
    # the events still tell which lease it was by its fencing order
    granted = [e for e in events(world.d, "lease.granted") if e.get("job") == job]
    assert granted and granted[-1]["token"] == lease.partition(".")[0], granted
    assert json.loads(bodies[0])["token"] == lease.partition(".")[0]  # the view shows the order alone
    holder = world.workers["gpua"]
    assert holder.post("release", {"job": job, "token": lease, "reason": "done"}).status_code == 200
    world.d.cli("job", "cancel", job, check=True)


def test_a_relayed_call_is_bound_to_the_token_that_claimed(world):
    """The relay scripts' own check (include/relay_guard.lua): the holder's name and its lease token are not
    enough; the call must come by the token the name was bound to when it claimed."""
    job, lease = leased(world)
    relay = RelayState(world.r, world.k, 200)
    seen = len(events(world.d, "lease.foreign_token"))
    before = snapshot(world)
    with pytest.raises(LeaseLost, match="is not leased to worker gpua"):
        relay.check(RelayCaller(job, lease, "gpua", "token:fleet"))
    with pytest.raises(LeaseLost):
        relay.progress(RelayCaller(job, lease, "gpua", "token:fleet"), "stolen")
    assert snapshot(world) == before  # type: ignore[arg-type]
    assert len(events(world.d, "lease.foreign_token")) == seen + 2
    assert relay.check(RelayCaller(job, lease, "gpua", "token:gpua")).pool == "gpu"  # the holder's own token
    holder = world.workers["gpua"]
    assert holder.post("release", {"job": job, "token": lease, "reason": "done"}).status_code == 200
    world.d.cli("job", "cancel", job, check=True)
