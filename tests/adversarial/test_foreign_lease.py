"""A lease is its holder's alone: another worker holding A's lease token (stolen) or a guess at the next one tries
every lease mutation over real HTTP against a real `piloop serve`, with real worker tokens: one of another pool, one
of A's own pool.

Each attempt is refused (lease_lost, or the `lost`/`stale` answer the route gives instead), changes no key of the
namespace (every key read by type, whole, before and after, the live-beat keys aside) and leaves exactly one
`lease.foreign_token` event naming the job, the thief and the holder. A's own calls then go through and the job
ends once.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import httpx
import pytest
import redis

from piloop_common.cas.local import LocalStore
from piloop_common.protocol.worker import RELAY_JOB_HEADER, RELAY_TOKEN_HEADER
from piloop_server.state.keys import Keys
from tests.helpers import adversary
from tests.helpers.adversary import LONG_TIMINGS, live_beats
from tests.helpers.workers import HandWorker, events, submit, token, view

ADDR = "sha256:" + "ab" * 32


@dataclass
class World:
    d: object
    r: redis.Redis
    ns: str
    workers: dict[str, HandWorker]

    @property
    def k(self) -> Keys:
        return Keys(self.ns)

    def volatile(self, key: str) -> bool:
        """The live-beat keys (tests.helpers.adversary.live_beats), rq's keys."""
        return key in live_beats(self.k, self.workers) or key.startswith(self.k.rq_prefix())


@pytest.fixture(scope="module")
def world(tcp_daemon):
    s = tcp_daemon(LONG_TIMINGS)
    made: dict[str, HandWorker] = {}
    try:
        for name, pool in (("gpua", "gpu"), ("gpub", "gpu"), ("judgeb", "judge")):
            made[name] = HandWorker(s.d, name, token(s.d, name, "--pool", pool), pool).register()
        yield World(s.d, s.r, s.ns, made)
    finally:
        for w in made.values():
            w.close()


def snapshot(w: World) -> dict[str, object]:
    return adversary.snapshot(w.r, w.k, w.volatile)


def leased_job(w: World, kind: str = "evaluation") -> dict:
    """A job of pool gpu that A (gpua) leases: its assignment."""
    job = submit(w.d, "true", pool="gpu", kind=kind)
    got = w.workers["gpua"].claim(kind)
    assert got["job"] == job, got
    return got


def guess_next(tok: str) -> str:
    """A token one fencing step on, the random part kept: what a thief might try when the stolen one is refused."""
    head, _, rest = tok.partition(".")
    return f"{int(head) + 1}.{rest}"


def relay_progress(w: World, thief: HandWorker, job: str, lease: str) -> httpx.Response:
    headers = {"Authorization": f"Bearer {thief.token}", RELAY_JOB_HEADER: job, RELAY_TOKEN_HEADER: lease}
    with httpx.Client(base_url=w.d.url, timeout=10) as c:  # type: ignore[attr-defined]
        return c.post("/v1/relay/progress", headers=headers, json={"note": "stolen"})


def attempts(w: World, thief: HandWorker, job: str, lease: str, live: str):
    """Each lease mutation a thief can make, with what it must answer: (what, call, check of the response)."""

    def lost(resp: httpx.Response) -> None:
        assert resp.status_code == 409, (resp.status_code, resp.text)
        got = resp.json()
        assert got["error"] == "lease_lost" and f"is not leased to worker {thief.name}" in got["message"], got

    def heartbeat_lost(resp: httpx.Response) -> None:
        assert resp.status_code == 200, resp.text
        assert resp.json()["jobs"] == {job: "lost"}, resp.text

    def report_stale(resp: httpx.Response) -> None:
        assert resp.status_code == 200, resp.text
        assert resp.json()["answer"] == "stale", resp.text

    def relay_refused(resp: httpx.Response) -> None:
        assert resp.status_code == 409, (resp.status_code, resp.text)
        got = resp.json()
        # the relay names the token's end before the holder when the token is not the live one (a guess)
        assert got["error"] == "lease_lost" and f"job {job}" in got["message"], got
        assert (
            f"is not leased to worker {thief.name}" if lease == live else "lease under this token has ended"
        ) in got["message"], got

    rid = "r" + uuid.uuid4().hex[:12]
    return [
        ("heartbeat", lambda: thief.post("heartbeat", thief.hello([{"job": job, "token": lease}])), heartbeat_lost),
        (
            "report",
            lambda: thief.post(
                "report", {"report_id": rid, "job": job, "token": lease, "outcome": "succeeded", "exit_code": 0}
            ),
            report_stale,
        ),
        ("release", lambda: thief.post("release", {"job": job, "token": lease, "reason": "stolen"}), lost),
        ("log", lambda: thief.post("log", {"job": job, "token": lease, "chunks": [ADDR]}), lost),
        ("progress", lambda: relay_progress(w, thief, job, lease), relay_refused),
    ]


@pytest.mark.parametrize("which", ["stolen", "guessed"])
@pytest.mark.parametrize("thief_name", ["judgeb", "gpub"], ids=["other_pool", "same_pool"])
def test_a_foreign_token_changes_nothing_and_is_named_once(world, thief_name, which):
    a = leased_job(world)
    job, tok = a["job"], a["token"]
    lease = tok if which == "stolen" else guess_next(tok)
    thief = world.workers[thief_name]
    for what, call, check in attempts(world, thief, job, lease, tok):
        seen = len(events(world.d, "lease.foreign_token"))
        before = snapshot(world)
        check(call())
        after = snapshot(world)
        changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
        assert not changed, (what, changed)
        new = events(world.d, "lease.foreign_token")[seen:]
        assert [(e["job"], e["worker"], e["holder"]) for e in new] == [(job, thief_name, "gpua")], (what, new)
    v = view(world.d, job)
    assert (v["state"], v["worker"], v["token"]) == ("leased", "gpua", tok.partition(".")[0]), v
    assert world.r.hget(world.k.job(job), "token") == tok.encode()  # the holder's alone: no view shows it
    assert v["log"] == [] and v["progress"] == [], v
    # A's own release still goes through (and frees its slot for the next test)
    back = world.workers["gpua"].post("release", {"job": job, "token": tok, "reason": "done with it"})
    assert back.status_code == 200, back.text
    world.d.cli("job", "cancel", job, check=True)


def test_the_holder_still_reports_and_the_job_ends_once(world):
    a = leased_job(world)
    job, tok = a["job"], a["token"]
    holder = world.workers["gpua"]
    for thief_name in ("judgeb", "gpub"):
        for lease in (tok, guess_next(tok)):
            for _what, call, check in attempts(world, world.workers[thief_name], job, lease, tok):
                check(call())
    # A's own lease is whole: its heartbeat renews it, its log append is kept, its report ends the job
    beat = holder.post("heartbeat", holder.hello([{"job": job, "token": tok}]))
    assert beat.status_code == 200 and beat.json()["jobs"] == {job: "ok"}, beat.text
    chunk = LocalStore(world.d.home / "cas").put_bytes(b"the holder's log\n")  # a chunk is sized in the CAS
    logged = holder.post("log", {"job": job, "token": tok, "chunks": [chunk]})
    assert logged.status_code == 200 and logged.json() == {"dropped": 0}, logged.text
    rid = "r" + uuid.uuid4().hex[:12]
    body = {"report_id": rid, "job": job, "token": tok, "outcome": "succeeded", "exit_code": 0}
    done = holder.post("report", body)
    assert done.status_code == 200, done.text
    assert done.json() == {"answer": "accepted", "state": "succeeded"}, done.text
    # the same report again is the same answer; another report of the ended lease is stale; the job ended once
    again = holder.post("report", body)
    assert again.json() == done.json(), again.text
    late = holder.post("report", {**body, "report_id": rid + "x"})
    assert late.json()["answer"] == "stale", late.text
    v = view(world.d, job)
    assert v["state"] == "succeeded" and v["attempts"] <= 1 and v["log"] == [chunk], v
    assert v["worker"] in ("gpua", ""), v
    ends = [e for e in events(world.d) if e.get("job") == job and e["type"] in ("job.succeeded", "job.ended")]
    assert len(ends) <= 1, ends
    assert not world.r.exists(world.k.lease(job))
