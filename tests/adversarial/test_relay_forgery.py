"""The relay trusts the lease, not the caller: a job's relayed calls, forged every way a job (or a worker holding a
token) could, over real HTTP against a real `piloop serve`, with real worker tokens and real leased jobs.

Each attack answers a refusal (4xx naming what was wrong) and leaves the namespace's jobs, leases, queues, scores and
campaign keys as they were: every key is read before and after (by type, whole), the live-beat keys aside (the
events stream, the workers' records and alive keys, the lease deadlines, the daemon's pass). The one accepted call
queues exactly the campaign's evaluation of the named commit, in the campaign's eval pool.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import redis

from piloop_common.protocol.worker import RELAY_JOB_HEADER, RELAY_TOKEN_HEADER, JobSpec
from piloop_server.state.keys import Keys
from tests.helpers import adversary
from tests.helpers.adversary import executor, live_beats, pool
from tests.helpers.redis import wait_for
from tests.helpers.serve import Daemon
from tests.helpers.workers import RemoteWorker, events, lease_token, state, submit, token, view

CONFIG = executor(2, 10) + pool("gpu", 4, 1) + pool("judge", 0, 1)
EVAL = 'echo "evaluating $(git rev-parse HEAD)"; echo score=7'
GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, check=True, capture_output=True, text=True, env={**os.environ, **GIT_ENV}
    ).stdout.strip()


def make_repo(path: Path) -> tuple[str, str]:
    """A repo of two commits on `main`, its own (the path is in them): (base, its parent)."""
    path.mkdir(parents=True)
    _git(path, "init", "-q", "-b", "main")
    for n in ("one", "two"):
        (path / "f.txt").write_text(f"{n} {path}")
        _git(path, "add", "-A")
        _git(path, "commit", "-qm", n)
    return _git(path, "rev-parse", "HEAD"), _git(path, "rev-parse", "HEAD~1")


@dataclass
class Lease:
    job: str
    token: str  # the lease's
    worker: str  # its holder


@dataclass
class World:
    d: Daemon
    r: redis.Redis
    ns: str
    tokens: dict[str, str]  # worker name -> its token
    base: str
    parent: str
    victim_base: str
    stop: Path
    procs: dict[str, RemoteWorker]
    leases: dict[str, Lease] = field(default_factory=dict)

    @property
    def k(self) -> Keys:
        return Keys(self.ns)

    def volatile(self, key: str) -> bool:
        """What live workers and the pass rewrite on their own, whatever a relayed call does: the events stream,
        the lease deadlines, the daemon's pass, each worker's record and alive key, the background tasks' keys."""
        return key in live_beats(self.k, self.tokens) or key.startswith(self.k.rq_prefix())

    def lease(self, what: str) -> Lease:
        return self.leases[what]


def wait_running(d: Daemon, job: str) -> Lease:
    v = state(d, job, "running", timeout=60)
    return Lease(job, lease_token(d, job), v["worker"])


def campaign_agent(d: Daemon, name: str) -> Lease:
    def live() -> str:
        got = json.loads(d.cli("campaign", "show", name, "--json", check=True).stdout)
        return next((r["job"] for r in got["runs"] if r["state"] == "running"), "")

    return wait_running(d, wait_for(live, 60, interval=0.2, what=f"an agent of campaign {name} running"))


@pytest.fixture(scope="module")
def world(tcp_daemon, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("forgery")
    s = tcp_daemon(CONFIG)
    d, r, ns = s.d, s.r, s.ns
    made: dict[str, RemoteWorker] = {}
    try:
        tokens = {
            "gpu1": token(d, "gpu1", "--pool", "gpu"),
            "gpu2": token(d, "gpu2", "--pool", "gpu"),
            "judge1": token(d, "judge1", "--pool", "judge"),
        }
        for name, tok in tokens.items():
            made[name] = RemoteWorker(d, tok, pool="judge" if name.startswith("judge") else "gpu").start()
        d.cli("secret", "set", "AGENT_KEY", input="s3cret", check=True)
        base, parent = make_repo(tmp / "repo")
        victim_base, _ = make_repo(tmp / "victim")
        stop = tmp / "stop"
        hold = f"while [ ! -e {stop} ]; do sleep 0.2; done"
        # c1: agents on gpu with a secret and env of their own; its evaluations on judge
        d.cli(
            "campaign",
            "create",
            "c1",
            "--repo",
            str(tmp / "repo"),
            "--agent-cmd",
            hold,
            "--eval-cmd",
            EVAL,
            "--agents",
            "1",
            "--agent-pool",
            "gpu",
            "--eval-pool",
            "judge",
            "--secret",
            "AGENT_KEY",
            "--env",
            "AGENT_ONLY=1",
            check=True,
        )
        # c2, the victim: its evaluations on gpu
        d.cli(
            "campaign",
            "create",
            "c2",
            "--repo",
            str(tmp / "victim"),
            "--agent-cmd",
            hold,
            "--eval-cmd",
            EVAL,
            "--agents",
            "1",
            "--agent-pool",
            "gpu",
            "--eval-pool",
            "gpu",
            check=True,
        )
        w = World(d, r, ns, tokens, base, parent, victim_base, stop, made)
        w.leases["agent"] = campaign_agent(d, "c1")
        w.leases["victim"] = campaign_agent(d, "c2")
        w.leases["evaluation"] = wait_running(d, submit(d, "sh", "-c", hold, pool="gpu"))
        w.leases["plain"] = wait_running(d, submit(d, "sh", "-c", hold, pool="gpu", kind="agent"))
        w.leases["labelled"] = wait_running(
            d, submit(d, "sh", "-c", hold, pool="gpu", kind="agent", opts=("--campaign", "nope"))
        )
        yield w
    finally:
        (tmp / "stop").touch()
        for c in ("c1", "c2"):
            d.cli("campaign", "pause", c)
        for wk in made.values():
            wk.cleanup()


def relay(
    w: World,
    method: str,
    path: str,
    *,
    worker: str,
    job: str,
    lease: str,
    body: object = None,
    raw: bytes | None = None,
) -> httpx.Response:
    """A relayed call as a worker's relay makes it: the worker's own token, the job and lease in two headers."""
    headers = {"Authorization": f"Bearer {w.tokens[worker]}", RELAY_JOB_HEADER: job, RELAY_TOKEN_HEADER: lease}
    if raw is not None:
        headers["Content-Type"] = "application/json"
    with httpx.Client(base_url=w.d.url, timeout=10) as c:  # type: ignore[attr-defined]
        return c.request(method, path, headers=headers, json=body if raw is None else None, content=raw)


def as_holder(w: World, what: str, method: str, path: str, body: object = None, **kw: object) -> httpx.Response:
    ls = w.lease(what)
    return relay(w, method, path, worker=ls.worker, job=ls.job, lease=ls.token, body=body, **kw)  # type: ignore[arg-type]


def snapshot(w: World) -> dict[str, object]:
    """Every key of the namespace with its whole value, read by type; the live-beat keys aside."""
    return adversary.snapshot(w.r, w.k, w.volatile)


def refused(w: World, call, status: int, *words: str) -> dict:
    """Make `call`; it answers `status` with a message holding `words`, and no key changed."""
    before = snapshot(w)
    resp = call()
    assert resp.status_code == status, (resp.status_code, resp.text)
    got = resp.json()
    assert all(word in got["message"] for word in words), got
    assert "\n" not in got["message"]
    after = snapshot(w)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    assert not changed, changed
    return got


def submit_body(w: World, **extra: object) -> dict:
    return {"commit": w.base, **extra}


# -- the body: the agent names a commit and nothing else ----------------------------------------------------

FORGED = [
    ("campaign", {"campaign": "c2"}),
    ("pool", {"pool": "gpu"}),
    ("kind", {"kind": "agent"}),
    (
        "scoring",
        {
            "spec": {
                "argv": ["sh", "-c", "echo score=999999"],
                "campaign": {
                    "repo": {"campaign": "c2", "bundle": "sha256:" + "0" * 64, "commit": "0" * 40, "branch": "runs/x"},
                    "score": True,
                },
            }
        },
    ),
    ("argv", {"spec": {"argv": ["sh", "-c", "cat /etc/passwd"]}}),
    ("image", {"image": "attacker/image"}),
    ("secrets", {"spec": {"argv": ["env"], "secrets": ["AGENT_KEY"]}}),
    ("env", {"env": {"LD_PRELOAD": "/tmp/x.so"}}),
    ("inputs", {"inputs": {"x": "sha256:" + "1" * 64}}),
    ("everything", {"kind": "evaluation", "pool": "gpu", "campaign": "c2", "image": "", "spec": {"argv": ["true"]}}),
]


@pytest.mark.parametrize("what,extra", FORGED, ids=[f[0] for f in FORGED])
def test_a_forged_field_is_refused(world, what, extra):
    got = refused(
        world,
        lambda: as_holder(world, "agent", "POST", "/v1/relay/submit", submit_body(world, **extra)),
        400,
        "an agent names only the commit to evaluate",
        *extra,
    )
    assert got["error"] == "bad_request"


BAD_COMMITS = [
    ("a ref name", "HEAD", 400, "not a commit's sha"),
    ("too short", "abc12", 400, "not a commit's sha"),
    ("upper case", "ABCDEF0", 400, "not a commit's sha"),
    ("too long", "a" * 41, 400, "not a commit's sha"),
    ("an option", "--all", 400, "not a commit's sha"),
    ("not a string", 12345678, 400, "commit"),
    ("not in the repo", "0" * 40, 404, "not a commit of campaign c1's repo"),
    ("another repo's", None, 404, "not a commit of campaign c1's repo"),
]


@pytest.mark.parametrize("what,commit,status,words", BAD_COMMITS, ids=[b[0] for b in BAD_COMMITS])
def test_a_bad_commit_is_refused(world, what, commit, status, words):
    if commit is None:  # the victim campaign's base: a real commit, of another campaign's repo
        commit = world.victim_base
    refused(world, lambda: as_holder(world, "agent", "POST", "/v1/relay/submit", {"commit": commit}), status, words)


def test_a_body_that_is_not_an_object_is_refused(world):
    for raw in (b"not json", b"[]", b'"' + world.base.encode() + b'"', b"{}"):
        refused(world, lambda raw=raw: as_holder(world, "agent", "POST", "/v1/relay/submit", raw=raw), 400, "")


# -- whose lease: the holder, under its token, of a live uncancelled agent of a campaign ---------------------


def test_another_jobs_id_with_your_own_token_is_refused(world):
    me, other = world.lease("agent"), world.lease("victim")
    # my worker, the victim's job id, my lease's token: the lease key of that job holds another token
    for method, path, body in (
        ("POST", "/v1/relay/submit", {"commit": world.base}),
        ("GET", "/v1/relay/job", None),
        ("POST", "/v1/relay/progress", {"note": "x"}),
    ):
        refused(
            world,
            lambda method=method, path=path, body=body: relay(
                world, method, path, worker=me.worker, job=other.job, lease=me.token, body=body
            ),
            409,
            "lease under this token has ended",
        )
    # a job that does not exist, and the headers missing
    refused(
        world,
        lambda: relay(world, "GET", "/v1/relay/job", worker=me.worker, job="jnope", lease=me.token),
        409,
        "lease under this token has ended",
    )
    refused(
        world, lambda: relay(world, "GET", "/v1/relay/job", worker=me.worker, job="", lease=""), 400, RELAY_JOB_HEADER
    )


def test_another_workers_lease_token_is_refused_and_named(world):
    me = world.lease("agent")
    thief = next(n for n in ("gpu1", "gpu2", "judge1") if n != me.worker)
    before = len(events(world.d, "lease.foreign_token"))
    for method, path, body in (
        ("POST", "/v1/relay/submit", {"commit": world.base}),
        ("GET", "/v1/relay/job", None),
        ("POST", "/v1/relay/progress", {"note": "x"}),
    ):
        refused(
            world,
            lambda method=method, path=path, body=body: relay(
                world, method, path, worker=thief, job=me.job, lease=me.token, body=body
            ),
            409,
            f"is not leased to worker {thief}",
        )
    # one event a call, naming both workers (the stream is left out of the snapshots: this is its one change)
    seen = events(world.d, "lease.foreign_token")[before:]
    assert [(e["job"], e["worker"], e["holder"]) for e in seen] == [(me.job, thief, me.worker)] * 3, seen


def test_an_evaluations_lease_cannot_submit(world):
    ev = world.lease("evaluation")
    refused(
        world,
        lambda: as_holder(world, "evaluation", "POST", "/v1/relay/submit", {"commit": world.base}),
        403,
        f"job {ev.job} is an evaluation",
        "only a campaign's agent may submit",
    )


def test_a_plain_agents_lease_cannot_submit(world):
    refused(
        world,
        lambda: as_holder(world, "plain", "POST", "/v1/relay/submit", {"commit": world.base}),
        403,
        "is an agent of no campaign",
    )
    refused(
        world,
        lambda: as_holder(world, "labelled", "POST", "/v1/relay/submit", {"commit": world.base}),
        403,
        "campaign nope is not a campaign",
    )


def test_the_job_view_is_the_callers_own(world):
    me = world.lease("agent")
    got = as_holder(world, "agent", "GET", "/v1/relay/job")
    assert got.status_code == 200, got.text
    v = got.json()
    assert v["id"] == me.job and v["worker"] == me.worker and v["campaign"] == "c1"
    # a path or query naming another job is not a route of the relay
    for path in (f"/v1/relay/job/{world.lease('victim').job}", f"/v1/relay/job?id={world.lease('victim').job}"):
        resp = as_holder(world, "agent", "GET", path)
        assert resp.status_code == 404 or resp.json()["id"] == me.job, resp.text


def test_a_progress_note_has_a_cap_and_the_list_is_bounded(world):
    refused(
        world,
        lambda: as_holder(world, "plain", "POST", "/v1/relay/progress", {"note": "x" * 2001}),
        400,
        "note",
        "2000",
    )
    refused(world, lambda: as_holder(world, "plain", "POST", "/v1/relay/progress", {"note": ""}), 400, "note")
    for i in range(205):
        resp = as_holder(world, "plain", "POST", "/v1/relay/progress", {"note": f"n{i}"})
        assert resp.status_code == 200, resp.text
    assert resp.json() == {"notes": 200}
    notes = [n["note"] for n in view(world.d, world.lease("plain").job)["progress"]]
    assert notes == [f"n{i}" for i in range(5, 205)]


# -- the one call that goes through --------------------------------------------------------------------------


def test_the_agents_submit_queues_exactly_its_campaigns_evaluation_of_the_commit(world):
    me = world.lease("agent")
    jobs = world.k.jobs()
    rec = {a.decode(): b.decode() for a, b in world.r.hgetall(world.k.campaign("c1")).items()}
    jobs_before = {j.decode() for j in world.r.zrange(jobs, 0, -1)}
    got = as_holder(world, "agent", "POST", "/v1/relay/submit", {"commit": world.parent[:10]})
    assert got.status_code == 200, got.text
    ev = got.json()["job"]
    assert {j.decode() for j in world.r.zrange(jobs, 0, -1)} - jobs_before == {ev}
    # asking again for the same commit answers the same job, and queues nothing
    again = as_holder(world, "agent", "POST", "/v1/relay/submit", {"commit": world.parent})
    assert again.status_code == 200 and again.json()["job"] == ev, again.text
    assert {j.decode() for j in world.r.zrange(jobs, 0, -1)} - jobs_before == {ev}
    v = view(world.d, ev)
    assert (v["kind"], v["pool"], v["campaign"], v["image"]) == ("evaluation", "judge", "c1", "")
    spec = dict(v["spec"])
    camp = spec.pop("campaign")
    # the campaign's eval spec as it stands, not the agent's (no secret, no env of the agent's)
    assert JobSpec.model_validate(spec) == JobSpec.model_validate_json(rec["eval_spec"])
    assert spec["argv"] == ["sh", "-c", EVAL] and spec["secrets"] == [] and spec["env"] == {}
    assert camp == {
        "repo": {"campaign": "c1", "bundle": rec["bundle"], "commit": world.parent, "branch": f"runs/{me.job}"},
        "collect": False,
        "score": True,
    }
    (queued,) = [e for e in events(world.d, "job.queued") if e["job"] == ev]
    assert queued["by"] == f"worker:{me.worker}/job:{me.job}" and queued["parent"] == me.job
    assert queued["pool"] == "judge"
    # it runs on the eval pool's worker, at that commit, and is scored; the run's rank is its own head's alone
    done = state(world.d, ev, "succeeded", "failed", timeout=60)
    assert done["state"] == "succeeded" and done["worker"] == "judge1" and done["result"]["score"] == 7, done
    c = json.loads(world.d.cli("campaign", "show", "c1", "--json", check=True).stdout)
    assert c["best"] is None and all(r["score"] is None for r in c["runs"]), c


def test_a_cancelled_jobs_lease_cannot_submit(world):
    """Last: it ends the campaign's agent. Its worker is stopped, so the lease outlives the cancel for a while."""
    me = world.lease("agent")
    holder = world.procs[me.worker]
    holder.pause()
    try:
        world.d.cli("job", "cancel", me.job, check=True)
        wait_for(
            lambda: view(world.d, me.job)["state"] in ("leased", "running") and events(world.d, "job.cancel_requested"),
            10,
            interval=0.05,
            what="the cancel recorded",
        )
        assert world.r.get(world.k.lease(me.job)).decode() == me.token  # the lease is still live
        # the daemon integrates the earlier tests' finished runs in the background; let it settle first
        wait_for(lambda: not world.r.scard(world.k.campaign_pending()), 30, what="earlier runs integrated")
        for method, path, body in (
            ("POST", "/v1/relay/submit", {"commit": world.base}),
            ("POST", "/v1/relay/progress", {"note": "x"}),
            ("GET", "/v1/relay/job", None),
        ):
            refused(
                world,
                lambda method=method, path=path, body=body: as_holder(world, "agent", method, path, body),
                409,
                "was cancelled",
            )
    finally:
        holder.resume()
