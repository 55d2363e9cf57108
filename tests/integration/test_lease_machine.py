"""A hypothesis state machine over the lease scripts on a real redis-server.

It interleaves enqueue, claim, heartbeat, lapse (a lease key's TTL running out), the pass's
expiry, report (out of memory too, and retries with backoff), the pass's due, cancel and release
over several workers, and checks after every step: no job is leased twice, tokens only grow,
every job is in exactly one place (a failed job waiting out its backoff in `delayed`), slot
counts stay within the pool's, and no worker's granted memory exceeds the room it claimed with.
Beside the workers, an attacker replays stolen, stale and guessed tokens under another worker's name on every
lease mutation (renew, report, release, log): each changes nothing (the job, its lease and its deadline as they
were) and answers lost; a stolen one leaves a `lease.foreign_token` event. A job's terminal state is reached once,
and a job whose cancel was asked for is never leased again.
"""

from __future__ import annotations

import itertools
import uuid

import pytest
import redis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from piloop_common.errors import Conflict, LeaseLost
from piloop_common.protocol.operator import JobResult
from piloop_server.state.generation import GenerationRecord, ensure_generation
from piloop_server.state.keys import Keys
from piloop_server.state.leases import LeasesState
from piloop_server.state.records.lease import KINDS, Lease, Timings, fence

WORKERS = ("w1", "w2", "w3")
SLOTS = {"agent": 2, "evaluation": 1}
CAMPAIGNS = ("c1", "c2")
ROOM = {"w1": 2048, "w2": 1024, "w3": None}  # w3 sends no room: its grants are not checked
TERMINAL = {"succeeded", "failed", "cancelled", "lost", "worker_lost"}


def _s(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


@pytest.fixture
def machine_env(redis_server, tmp_path):
    LeaseMachine.url = redis_server.url
    LeaseMachine.tmp = tmp_path
    yield


class LeaseMachine(RuleBasedStateMachine):
    url = ""
    tmp = None

    def __init__(self) -> None:
        super().__init__()
        self.r = redis.Redis.from_url(self.url)
        self.k = Keys("m" + uuid.uuid4().hex[:10])
        ensure_generation(self.r, self.k, GenerationRecord(self.tmp / f"{self.k.namespace}.json"), 0)
        # long timings: time never passes by itself here, the `lapse` rule makes it pass
        self.l = LeasesState(self.r, self.k, Timings(grace_ms=600_000, toleration_ms=900_000, max_lost=2))
        self.l.expire()
        for w in WORKERS:
            self.l.register(w, "p", "", "cas", {}, protocol=1, by=f"worker:{w}")
        self.ids = itertools.count()
        self.jobs: list[str] = []
        self.held: dict[str, dict[str, str]] = {w: {} for w in WORKERS}  # what each worker believes it holds
        self.max_token = 0
        self.reports = itertools.count()
        self.given: list[tuple[str, str, str]] = []  # every (worker, job, token) ever leased: to steal and replay
        self.cancelled: set[str] = set()  # jobs whose cancel was asked for
        self.ended: dict[str, str] = {}  # job -> the terminal state it reached

    def teardown(self) -> None:
        for key in self.r.scan_iter(match=self.k.prefix() + "*", count=500):
            self.r.delete(key)
        self.r.close()

    def _take(self, tokens) -> None:
        for t in tokens:
            assert fence(t) > self.max_token, "a token went backwards"
            self.max_token = fence(t)

    @rule(
        kind=st.sampled_from(KINDS),
        campaign=st.sampled_from(CAMPAIGNS),
        memory=st.sampled_from([None, 512, 1024, 1536]),
        attempts=st.integers(1, 3),
        backoff=st.sampled_from([0, 1000]),
    )
    def enqueue(self, kind, campaign, memory, attempts, backoff):
        jid = f"j{next(self.ids)}"
        spec = {"memory_mb": memory, "max_attempts": attempts, "backoff_seconds": backoff}
        self.l.enqueue(jid, kind, "p", spec, by="human:test", campaign=campaign if kind == "agent" else "")
        self.jobs.append(jid)

    @rule(worker=st.sampled_from(WORKERS), kind=st.sampled_from(KINDS), most=st.integers(1, 3))
    def claim(self, worker, kind, most):
        c = self.l.claim(
            worker, "p", kind, slots=SLOTS[kind], image="", most=most, room_mb=ROOM[worker], default_mb=256
        )
        self._take(lease.token for lease in c.leases)
        for lease in c.leases:
            assert lease.job not in self.cancelled, f"{lease.job} was leased again after its cancel"
            self.held[worker][lease.job] = lease.token
            self.given.append((worker, lease.job, lease.token))

    @rule(worker=st.sampled_from(WORKERS))
    def heartbeat(self, worker):
        held = [Lease(j, t) for j, t in self.held[worker].items()]
        _, statuses = self.l.heartbeat(worker, {}, held)
        for j, s in statuses.items():
            if s == "lost":  # the worker stops that job at once
                self.held[worker].pop(j, None)

    @precondition(lambda self: any(self.held.values()))
    @rule(data=st.data())
    def lapse(self, data):
        """A lease's TTL runs out (its worker went silent)."""
        worker = data.draw(st.sampled_from([w for w in WORKERS if self.held[w]]))
        job = data.draw(st.sampled_from(sorted(self.held[worker])))
        self.r.delete(self.k.lease(job))
        if self.r.zscore(self.k.deadlines(), job) is not None:
            self.r.zadd(self.k.deadlines(), {job: 0})

    @rule()
    def expire(self):
        self.l.expire()

    @precondition(lambda self: any(self.held.values()))
    @rule(
        data=st.data(),
        outcome=st.sampled_from(["succeeded", "failed", "fenced", "cancelled"]),
        twice=st.booleans(),
        oom=st.booleans(),
    )
    def report(self, data, outcome, twice, oom):
        worker = data.draw(st.sampled_from([w for w in WORKERS if self.held[w]]))
        job = data.draw(st.sampled_from(sorted(self.held[worker])))
        token = self.held[worker].pop(job)
        rid = f"r{next(self.reports)}"
        oom = oom and outcome == "failed"
        first = self.l.report(rid, job, token, worker, outcome, JobResult(), oom=oom, memory_caps={"p": 3072})
        if twice:
            assert self.l.report(rid, job, token, worker, outcome, JobResult(), oom=oom) == first

    @rule()
    def due(self):
        """Every backoff passes at once, and the pass puts those jobs back."""
        for j in self.r.zrange(self.k.delayed(), 0, -1):
            self.r.zadd(self.k.delayed(), {j: 0})
        self.l.due()

    @precondition(lambda self: self.jobs)
    @rule(data=st.data())
    def cancel(self, data):
        job = data.draw(st.sampled_from(self.jobs))
        try:
            self.l.cancel(job, "human:test")
            self.cancelled.add(job)
        except Conflict:
            pass  # it had ended

    @precondition(lambda self: any(self.held.values()))
    @rule(data=st.data())
    def release(self, data):
        worker = data.draw(st.sampled_from([w for w in WORKERS if self.held[w]]))
        job = data.draw(st.sampled_from(sorted(self.held[worker])))
        token = self.held[worker].pop(job)
        try:
            self.l.release(job, token, worker)
        except LeaseLost:
            pass  # its lease lapsed first: nothing changed

    @rule(worker=st.sampled_from(WORKERS))
    def worker_dies(self, worker):
        self.held[worker] = {}

    def _snapshot(self, job: str) -> tuple:
        r, k = self.r, self.k
        return (
            r.hmget(k.job(job), "state", "worker", "token", "attempts", "lost", "result", "history"),
            r.get(k.lease(job)),
            r.zscore(k.deadlines(), job),
            r.llen(k.job_log(job)),
        )

    def _foreign_events(self) -> int:
        return sum(1 for _, f in self.r.xrange(self.k.events()) if f[b"type"] == b"lease.foreign_token")

    @precondition(lambda self: self.given)
    @rule(
        data=st.data(),
        how=st.sampled_from(["stolen", "guessed"]),
        call=st.sampled_from(["heartbeat", "report", "release", "log"]),
    )
    def attacker(self, data, how, call):
        """Another worker's (or a stale) token, or a guess of the next one, under the attacker's own name."""
        victim, job, token = data.draw(st.sampled_from(self.given))
        thief = data.draw(st.sampled_from([w for w in WORKERS if w != victim]))
        if how == "guessed":
            token = f"{fence(token) + 1}.{'0' * 32}"
        if self.held[thief].get(job) == token:
            return  # the thief holds this very lease itself
        before, events = self._snapshot(job), self._foreign_events()
        holder = _s(before[0][1] or b"")
        if call == "heartbeat":
            _, statuses = self.l.heartbeat(thief, {}, [Lease(job, token)])
            assert statuses == {job: "lost"}
        elif call == "report":
            got = self.l.report(f"x{next(self.reports)}", job, token, thief, "succeeded", JobResult(exit_code=0))
            assert got == {"answer": "stale"}
        else:
            with pytest.raises(LeaseLost):
                if call == "release":
                    self.l.release(job, token, thief)
                else:
                    self.l.append_log(job, token, thief, ["sha256:" + "0" * 64])
        after = self._snapshot(job)
        assert after == before, f"{how} {call} by {thief} changed {job}"
        if holder and holder != thief:
            assert self._foreign_events() == events + 1, "a foreign token leaves one lease.foreign_token event"

    @invariant()
    def each_job_in_exactly_one_place(self):
        if not self.jobs:
            return
        queued: set[str] = set()
        active: set[str] = set()
        delayed = {_s(x) for x in self.r.zrange(self.k.delayed(), 0, -1)}
        for kind in KINDS:
            queued |= {_s(x) for x in self.r.zrange(self.k.queue("p", kind), 0, -1)}
            active |= {_s(x) for x in self.r.smembers(self.k.active("p", kind))}
        holders: dict[str, list[str]] = {}
        for w in WORKERS:
            for kind in KINDS:
                members = {_s(x) for x in self.r.smembers(self.k.worker_leases(w, kind))}
                assert len(members) <= SLOTS[kind], f"{w} holds {len(members)} {kind} leases"
                for j in members:
                    holders.setdefault(j, []).append(w)
        live = {c: 0 for c in CAMPAIGNS}
        for j in self.jobs:
            f = self.r.hmget(self.k.job(j), "state", "token", "kind", "campaign")
            state = _s(f[0])
            places = (j in queued) + (j in active) + (state in TERMINAL) + (j in delayed)
            assert places == 1, f"{j} ({state}) is in {places} places"
            if j in delayed:
                assert state == "queued" and self.r.hget(self.k.job(j), "retry_at") is not None
            assert state in TERMINAL | {"queued", "leased", "running"}
            if j in active:
                assert state in ("leased", "running")
                assert len(holders.get(j, [])) == 1, f"{j} is leased to {holders.get(j)}"
                assert self.r.zscore(self.k.deadlines(), j) is not None
                if _s(f[2]) == "agent":
                    live[_s(f[3])] += 1
            else:
                assert j not in holders, f"{j} ({state}) still counts in {holders[j]}'s slots"
                assert not self.r.exists(self.k.lease(j))
        for c, n in live.items():
            assert int(self.r.hget(self.k.campaign_live(), c) or 0) == n, f"campaign {c} live count"

    @invariant()
    def a_terminal_state_is_reached_once(self):
        for j in self.jobs:
            state = _s(self.r.hget(self.k.job(j), "state"))
            if j in self.ended:
                assert state == self.ended[j], f"{j} ended {self.ended[j]}, then became {state}"
            elif state in TERMINAL:
                self.ended[j] = state
            if j in self.cancelled and state in TERMINAL:
                assert state in ("cancelled", "lost"), f"{j} was cancelled but ended {state}"

    @invariant()
    def granted_never_exceeds_room(self):
        for w, room in ROOM.items():
            if room is None:
                continue
            granted = 0
            for kind in KINDS:
                for j in self.r.smembers(self.k.worker_leases(w, kind)):
                    granted += int(self.r.hget(self.k.job(_s(j)), "granted_mb") or 0)
            assert granted <= room, f"{w} granted {granted} MiB in a room of {room}"

    @invariant()
    def a_lease_key_names_the_job_token(self):
        for j in self.jobs:
            v = self.r.get(self.k.lease(j))
            if v is not None:
                assert _s(v) == _s(self.r.hget(self.k.job(j), "token"))


TestLeaseMachine = LeaseMachine.TestCase
TestLeaseMachine.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
TestLeaseMachine = pytest.mark.usefixtures("machine_env")(TestLeaseMachine)
