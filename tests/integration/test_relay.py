"""A job's own `piloop` calls through its worker's relay: accepted while its lease is live, refused after.

A real `piloop serve` on TCP, a real `piloop worker` (`gpu1`), and jobs that run the real CLI inside themselves.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from piloop_common.errors import LeaseLost
from piloop_common.protocol.worker import RELAY_JOB_HEADER, RELAY_TOKEN_HEADER
from piloop_common.sdk.client import ApiClient
from tests.helpers.redis import free_port, wait_for
from tests.helpers.serve import Daemon, short_home
from tests.helpers.workers import lease_token, state, token, view

# A kill grace long enough for a SIGTERMed job to run one more `piloop` (an interpreter start on a busy box):
# toleration 10 > grace 2 + 2 × renew 0.5 + timeout 1 + kill grace 5; the shim fences 10 − 5.2 = 4.8 s after a renewal.
RELAY_EXECUTOR = """
[plugins.executor]
renew_seconds = 0.5
grace_seconds = 2
toleration_seconds = 10
request_timeout_seconds = 1
kill_grace_seconds = 5
pass_seconds = 0.2

[plugins.executor.pools.serve]
agents = 0
evaluations = 0

[plugins.executor.pools.gpu]
agents = 1
evaluations = 1
max_load = 1000
min_memory_gb = 0
"""
PILOOP = f"{sys.executable} -m piloop_common.cli"


@pytest.fixture
def server(redis_server, namespace):
    d = Daemon(short_home(), config=RELAY_EXECUTOR, redis_url=redis_server.url, namespace=namespace)
    port = free_port()
    d.start(listen=f"127.0.0.1:{port}")
    d.url = f"http://127.0.0.1:{port}"
    yield d
    d.cleanup()


def agent(d: Daemon, script: str, campaign: str = "c1") -> str:
    return d.cli(
        "job",
        "submit",
        "--kind",
        "agent",
        "--pool",
        "gpu",
        "--campaign",
        campaign,
        "--",
        "sh",
        "-c",
        textwrap.dedent(script),
        check=True,
    ).stdout.strip()


def events(d: Daemon) -> list[dict]:
    return [json.loads(line) for line in d.cli("events", "--json", check=True).stdout.splitlines() if line]


def relayed(d: Daemon, tok: str, job: str, lease: str, path: str, body: dict | None = None) -> object:
    """The call a relay makes, made directly with the worker's token: what a replayed call would get."""
    with ApiClient(url=d.url, token=tok) as api:
        api.headers.update({RELAY_JOB_HEADER: job, RELAY_TOKEN_HEADER: lease})
        return api.call("POST" if body is not None else "GET", path, body)


def test_an_agent_notes_progress_and_is_told_what_it_may_submit_through_its_relay(server, workers, tmp_path):
    d = server
    workers(d, token(d, "gpu1")).start()
    out = tmp_path / "out"
    job = agent(
        d,
        f"""
        set -e
        test -S "$PILOOP_RELAY"
        {PILOOP} progress "halfway there"
        {PILOOP} job submit --pool gpu -- sh -c 'echo score=0.5' > {out}.child 2>&1 && exit 8 || true
        {PILOOP} job show "$PILOOP_JOB" --json > {out}.self
        {PILOOP} job list > {out}.list 2>&1 && exit 9 || true
        {PILOOP} progress done
    """,
    )
    v = state(d, job, "succeeded", "failed", "worker_lost")
    assert v["state"] == "succeeded", (v, d.cli("job", "show", job).stdout)
    assert [n["note"] for n in v["progress"]] == ["halfway there", "done"]
    assert {n["by"] for n in v["progress"]} == {f"worker:gpu1/job:{job}"}
    shown = d.cli("job", "show", job, check=True).stdout
    assert "halfway there" in shown and "progress" in shown
    # the job saw itself, live, and nothing else: leased, or running once a heartbeat carried it (the job's first
    # calls can all come within the first renew_seconds of its lease)
    me = json.loads(Path(f"{out}.self").read_text())
    assert me["id"] == job and me["state"] in ("leased", "running") and me["worker"] == "gpu1"
    assert me["token"] and me["progress"] == [n for n in v["progress"] if n["note"] == "halfway there"]
    assert "can only submit its campaign's evaluation of a commit" in Path(f"{out}.list").read_text()
    # a job's own spec is refused in one line saying what it may submit, and nothing is queued (the accepted
    # submit of a campaign's agent: tests/adversarial/test_relay_forgery.py)
    child = Path(f"{out}.child").read_text()
    assert child.startswith("piloop: --pool: inside a job, `piloop job submit REV`") and child.count("\n") == 1, child
    assert not [e for e in events(d) if e["type"] == "job.queued" and e.get("parent") == job]


def test_a_cancelled_agent_is_refused_and_nothing_changes(server, workers, tmp_path):
    d = server
    workers(d, token(d, "gpu1")).start()
    out = tmp_path / "out"
    # the agent notes progress until a call is refused (it ignores the cancel's SIGTERM to keep trying)
    job = agent(
        d,
        f"""
        trap '' TERM
        i=0
        while :; do
          i=$((i+1))
          if {PILOOP} progress "tick $i" > {out}.last 2>&1; then touch {out}.ready; else mv {out}.last {out}.late; exit 0; fi
        done
    """,
    )
    wait_for(lambda: Path(f"{out}.ready").exists(), 30, interval=0.1, what="the agent's first note")
    d.cli("job", "cancel", job, check=True)
    v = state(d, job, "cancelled", "failed", "worker_lost")
    late = Path(f"{out}.late").read_text()
    assert late.startswith("piloop: ") and "was cancelled: its lease is ending" in late, late
    (asked,) = [e for e in events(d) if e["type"] == "job.cancel_requested" and e["job"] == job]
    cancelled_ms = int(asked["id"].split("-")[0])
    assert v["progress"] and all(n["at_ms"] <= cancelled_ms for n in v["progress"]), (cancelled_ms, v["progress"])


def test_after_the_worker_is_killed_and_the_lease_expires_the_call_is_refused(server, workers, tmp_path):
    d = server
    tok = token(d, "gpu1")
    w = workers(d, tok).start()
    out = tmp_path / "out"
    # a note every ~0.3 s, recording each answer, until the shim fences the job
    job = agent(
        d,
        f"""
        i=0
        while :; do
          i=$((i+1)); {PILOOP} progress "tick $i" >> {out} 2>&1; echo "rc=$?" >> {out}; sleep 0.3
        done
    """,
    )
    wait_for(
        lambda: Path(out).exists() and "rc=0" in Path(out).read_text(),
        30,
        interval=0.1,
        what="a note through the relay",
    )
    lease = lease_token(d, job)
    w.kill()
    # the relay died with its worker: the job's next call fails at once, saying why
    wait_for(lambda: "rc=1" in Path(out).read_text(), 15, interval=0.1, what="a call refused after the kill")
    assert "the worker's relay at" in Path(out).read_text()
    v = state(d, job, "worker_lost", timeout=30)  # the lease expired; an agent ends worker_lost
    notes = v["progress"]
    # the same call, replayed with the worker's own token and the ended lease: 409 lease_lost, nothing written
    for path, body in (
        ("/v1/relay/progress", {"note": "late"}),
        ("/v1/relay/job", None),
        ("/v1/relay/submit", {"commit": "0" * 40}),
    ):
        with pytest.raises(LeaseLost, match="lease under this token has ended"):
            relayed(d, tok, job, lease, path, body)
    assert view(d, job)["progress"] == notes
    assert not [e for e in events(d) if e["type"] == "job.queued" and e.get("parent") == job]
