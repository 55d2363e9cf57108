"""Several servers on one Redis namespace (`piloop serve` and `piloop serve --replica`, docs/server.md): the pass
leader SIGKILLed mid-stream, the other takes the pass within the lease's TTL (inside grace) and every job ends
once; a leader SIGSTOPped until it is deposed changes nothing when it wakes."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from piloop_server.daemon import LEADER_TTL_SHARE
from piloop_server.leader import RENEWALS_PER_TTL
from piloop_server.state.keys import Keys
from tests.helpers.redis import free_port, wait_for
from tests.helpers.serve import FAST_EXECUTOR, Daemon, short_home
from tests.helpers.workers import GPU, GRACE, events, kill_tree_of, marker_job, marker_runs, overlapping, state, token

TTL = GRACE * LEADER_TTL_SHARE
# the most a follower waits for a lapsed lease: the TTL, and one renewal period; plus a loaded machine's slack
TAKEOVER_MOST = TTL + TTL / RENEWALS_PER_TTL + 0.5


@pytest.fixture
def servers(redis_server, namespace) -> Iterator[Callable[..., Daemon]]:
    """start(replica, home=None): `piloop serve [--replica] --listen 127.0.0.1:<port>` on the session Redis under
    this test's namespace, every home's CAS the first one's; `.url` is its address."""
    made: list[Daemon] = []
    cas: list[Path] = []

    def start(replica: bool, home: Path | None = None) -> Daemon:
        home = home or short_home("rp")
        cas_dir = cas[0] if cas else home / "cas"
        cas.append(cas_dir)
        config = FAST_EXECUTOR + GPU + f'\n[plugins.cas]\nprovider = "local"\npath = "{cas_dir}"\n'
        d = Daemon(home, config=config, redis_url=redis_server.url, namespace=namespace)
        port = free_port()
        d.start(listen=f"127.0.0.1:{port}", args=("--replica",) if replica else ())
        d.url = f"http://127.0.0.1:{port}"  # type: ignore[attr-defined]
        made.append(d)
        return d

    yield start
    for d in made:
        d.cleanup()
        kill_tree_of(str(d.home))


def _daemon(d: Daemon) -> dict:
    with d.api() as api:
        return api.call("GET", "/v1/status")["daemon"]


def _leader(r, namespace: str) -> str:
    raw = r.get(Keys(namespace).leader())
    return raw.decode().partition(" ")[2] if raw else ""


def _took_over(r, namespace: str, instance: str, since: float) -> float:
    """Seconds from `since` until `instance` holds the leader lease."""
    wait_for(lambda: _leader(r, namespace) == instance, GRACE + 5, interval=0.01, what=f"{instance} to lead")
    return time.monotonic() - since


def _ended_once(d: Daemon, marker: Path, jobs: list[str]) -> None:
    for j in jobs:
        v = state(d, j, timeout=60)
        assert v["state"] == "succeeded", v
    runs = marker_runs(marker)
    for j in jobs:
        assert len(runs[j]) == 1 and runs[j][0]["ended"] and not overlapping(runs[j]), (j, runs.get(j))
    ends = [e["job"] for e in events(d, "job.succeeded")]
    assert all(ends.count(j) == 1 for j in jobs), ends


def test_the_leader_killed_the_replica_takes_the_pass_and_a_stopped_leader_that_wakes_changes_nothing(
    servers, workers, redis_client, namespace, tmp_path
):
    a = servers(replica=False)
    b = servers(replica=True)
    ia, ib = _daemon(a)["instance"], _daemon(b)["instance"]
    assert _daemon(b)["replica"] is True and _daemon(b)["pass_leader"] == ia  # the first server took the pass
    assert "event=pass.leader" not in b.daemon_log()
    # each worker prefers another server; both fall back on the other
    w1 = workers(a, token(a, "w1"), url=f"{a.url},{b.url}").start()  # type: ignore[attr-defined]
    w2 = workers(a, token(a, "w2"), url=f"{b.url},{a.url}").start()  # type: ignore[attr-defined]
    marker = tmp_path / "marker"
    jobs = [marker_job(a, marker, seconds=1) for _ in range(6)]

    def mid_stream() -> bool:
        runs = [r for rs in marker_runs(marker).values() for r in rs]
        return any(r["ended"] for r in runs) and any(not r["ended"] for r in runs)

    wait_for(mid_stream, 40, interval=0.05, what="a job ended and another running")
    a.kill()  # SIGKILL: its lease is left to lapse
    took = _took_over(redis_client, namespace, ib, time.monotonic())
    print(f"\nthe replica took the pass {took:.2f}s after the leader's SIGKILL (lease TTL {TTL:g}s, grace {GRACE:g}s)")
    assert took <= TAKEOVER_MOST and took < GRACE, took
    leaders = events(b, "pass.leader")
    assert [e["server"] for e in leaders] == [ia, ib] and int(leaders[1]["token"]) > int(leaders[0]["token"])
    jobs += [marker_job(b, marker, seconds=1) for _ in range(2)]  # the replica's API takes work too
    _ended_once(b, marker, jobs)
    assert w1.alive and w2.alive

    # the first server back (a follower now), then the leader stopped until it is deposed
    a = servers(replica=False, home=a.home)
    ia = _daemon(a)["instance"]
    assert _leader(redis_client, namespace) == ib
    more = [marker_job(a, marker, seconds=1) for _ in range(4)]
    b.pause()
    took = _took_over(redis_client, namespace, ia, time.monotonic())
    print(f"the first server took the pass {took:.2f}s after the leader's SIGSTOP")
    assert took <= TAKEOVER_MOST and took < GRACE, took
    seen = len(events(a))
    b.resume()
    wait_for(lambda: "event=pass.deposed" in b.daemon_log(), 10, what="the woken server to learn it was deposed")
    # for two TTLs it never takes the lease back, and no write of its pass stands
    deadline = time.monotonic() + 2 * TTL
    while time.monotonic() < deadline:
        assert _leader(redis_client, namespace) == ia
        time.sleep(0.05)
    late = events(a)[seen:]
    assert not [e for e in late if e["type"] == "pass.leader"], late
    fenced = [e for e in late if e["type"] == "pass.fenced"]
    assert all(e["server"] == ib for e in fenced), fenced
    assert bool(fenced) == ("event=pass.fenced" in b.daemon_log())  # a refused write is one event and one line
    print(f"the woken leader's pass: {'refused by the fence' if fenced else 'stopped by its own clock'}")
    _ended_once(a, marker, jobs + more)
