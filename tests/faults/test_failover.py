"""Redis fails over under a running stream of jobs (docs/faults.md, "Redis fails over"): a primary, a replica and
three Sentinels, `piloop serve` on the Sentinel URL; and a promoted replica that really lacks the last writes."""

from __future__ import annotations

import os
import time

import redis

from tests.helpers.redis import RedisProcess, wait_for
from tests.helpers.sentinel import SentinelSet
from tests.helpers.serve import short_home
from tests.helpers.workers import events, marker_job, marker_runs, overlapping, state, tcp_server, token

JOBS = 8


def _order(tok: str) -> int:
    """A token's fencing order: `<generation><12-digit sequence>`, before its random part."""
    return int(tok.split(".")[0])


def _ms(event: dict) -> int:
    return int(event["id"].split("-")[0])


def _ended_once_never_overlapping(d, jobs, marker) -> dict:
    for j in jobs:
        v = state(d, j, timeout=60)
        assert v["state"] == "succeeded", v
    succeeded = [e["job"] for e in events(d, "job.succeeded")]
    runs = marker_runs(marker)
    for j in jobs:
        assert succeeded.count(j) == 1, (j, succeeded)  # ended exactly once
        assert not overlapping(runs[j]), runs[j]  # never two leases at once
        orders = [_order(r["token"]) for r in runs[j]]
        assert orders == sorted(orders) and len(set(orders)) == len(orders), runs[j]  # a rerun's token is higher
    return runs


def _tokens_moved_up(runs: dict, after: list[dict]) -> None:
    """No token goes backwards: each the new primary handed out is above every one the old primary did (those the
    jobs ran under, whether the new primary got them or not)."""
    new = {e["token"] for e in after}
    old = {r["token"] for rs in runs.values() for r in rs if r["token"].split(".")[0] not in new}
    assert old and min(_order(t) for t in new) > max(_order(t) for t in old), (sorted(old), sorted(new))


def test_sentinel_promotes_the_replica_under_a_stream_of_jobs_and_each_ends_once(tmp_path, workers, namespace):
    ss = SentinelSet(tmp_path / "redis").start()
    d = tcp_server(ss.url, namespace)
    try:
        marker = tmp_path / "marker"
        jobs = [marker_job(d, marker, seconds=0.4) for _ in range(JOBS)]
        workers(d, token(d, "wa")).start()  # after the submits: the stream runs while the test watches
        wait_for(lambda: len(marker_runs(marker)) >= 3, 40, interval=0.05, what="a few jobs to have started")
        old = ss.primary.port
        killed_ms = int(time.time() * 1000)
        ss.primary.stop(kill=True)  # SIGKILL, mid-stream
        wait_for(lambda: ss.master_port() != old, 40, interval=0.1, what="Sentinel to promote the replica")
        runs = _ended_once_never_overlapping(d, jobs, marker)
        after = [e for e in events(d, "lease.granted") if _ms(e) > killed_ms]  # the new primary's claims
        assert after, "no claim after the failover"
        print(f"\nfrom the SIGKILL to the next claim: {(_ms(after[0]) - killed_ms) / 1000:.2f} s")
        _tokens_moved_up(runs, after)
        assert "event=redis.failover" in d.daemon_log()
    finally:
        d.cleanup()
        ss.stop()


def test_a_promoted_replica_that_lacks_the_last_writes_holds_claims_escalates_and_moves_tokens_up(
    tmp_path, workers, namespace
):
    """The endpoint moves, as a managed Redis's DNS name does: the state URL is a unix socket path that is a
    symlink, switched from the primary's socket to the replica's after the replica stopped replicating (REPLICAOF NO
    ONE) and the primary took more claims."""
    socks = short_home("rs")  # a unix socket's path must be short
    link = socks / "r.sock"
    primary = RedisProcess(tmp_path / "p", extra=("--unixsocket", str(socks / "p.sock")))
    primary.start()
    replica = RedisProcess(
        tmp_path / "q", extra=("--unixsocket", str(socks / "q.sock"), "--replicaof", "127.0.0.1", str(primary.port))
    )
    replica.start()
    wait_for(lambda: SentinelSet.link_up(replica), 20, what="the replica to sync")
    os.symlink(socks / "p.sock", link)
    d = tcp_server(f"unix://{link}", namespace)
    try:
        marker = tmp_path / "marker"
        jobs = [marker_job(d, marker, seconds=0.4) for _ in range(JOBS)]
        workers(d, token(d, "wa")).start()
        wait_for(lambda: len(marker_runs(marker)) >= 2, 40, interval=0.05, what="jobs to have started")
        q, p = redis.Redis(port=replica.port), redis.Redis(port=primary.port)
        q.replicaof("NO", "ONE")  # the replica stops here: what the primary writes next it never gets
        cut = int(q.info("replication")["second_repl_offset"])
        started = len(marker_runs(marker))
        wait_for(lambda: len(marker_runs(marker)) >= started + 2, 40, interval=0.05, what="claims past the cut")
        seen_at = int(p.hget(f"{{{namespace}}}:daemon", "last_pass") or 0)
        # a pass of the daemon has looked at the primary's offset since those claims
        wait_for(
            lambda: int(p.hget(f"{{{namespace}}}:daemon", "last_pass") or 0) > seen_at, 10, what="a pass after them"
        )
        assert int(p.info("replication")["master_repl_offset"]) > cut  # the replica really lacks writes
        switched_ms = int(time.time() * 1000)
        tmp = socks / "r.new"
        os.symlink(socks / "q.sock", tmp)
        os.replace(tmp, link)
        primary.stop(kill=True)  # its last writes are gone with it
        held = wait_for(
            lambda: int(q.hget(f"{{{namespace}}}:daemon", "hold_until") or 0) > switched_ms and q,
            20,
            what="the daemon to hold claims on the new primary",
        )
        assert int(held.hget(f"{{{namespace}}}:daemon", "failover_at")) >= switched_ms
        wait_for(  # the worker's claims meanwhile, as the new primary keeps their reason
            lambda: q.hget(f"{{{namespace}}}:worker:wa", "reason") == b"recovering",
            10,
            interval=0.01,
            what="a claim answered recovering",
        )

        def escalated() -> list[dict]:
            with d.api() as api:
                return [e for e in api.call("GET", "/v1/status")["escalations"] if e["what"] == "redis.failover"]

        failover = wait_for(escalated, 10, what="the redis.failover escalation")
        assert "bytes of the writes last seen" in failover[0]["message"], failover
        runs = _ended_once_never_overlapping(d, jobs, marker)
        after = [e for e in events(d, "lease.granted") if _ms(e) > switched_ms]  # the new primary's claims
        assert after, "no claim after the switch"
        hold_until = int(held.hget(f"{{{namespace}}}:daemon", "hold_until"))
        assert min(_ms(e) for e in after) >= hold_until  # none while held (Redis's clock, both)
        _tokens_moved_up(runs, after)
    finally:
        d.cleanup()
        primary.stop(kill=True)
        replica.stop(kill=True)


def test_a_daemon_started_after_a_promotion_still_holds_claims_and_moves_tokens_up(tmp_path, namespace):
    """The daemon is stopped while the replica is promoted: its record keeps the replication id it last watched."""
    socks = short_home("rs")
    link = socks / "r.sock"
    primary = RedisProcess(tmp_path / "p", extra=("--unixsocket", str(socks / "p.sock"))).start()
    replica = RedisProcess(
        tmp_path / "q", extra=("--unixsocket", str(socks / "q.sock"), "--replicaof", "127.0.0.1", str(primary.port))
    ).start()
    wait_for(lambda: SentinelSet.link_up(replica), 20, what="the replica to sync")
    os.symlink(socks / "p.sock", link)
    d = tcp_server(f"unix://{link}", namespace)
    q = redis.Redis(port=replica.port)
    try:
        wait_for(lambda: q.get(f"{{{namespace}}}:generation"), 10, what="the marker on the replica")
        gen = int(q.get(f"{{{namespace}}}:generation"))
        d.stop()
        q.replicaof("NO", "ONE")
        tmp = socks / "r.new"
        os.symlink(socks / "q.sock", tmp)
        os.replace(tmp, link)
        primary.stop(kill=True)
        started_ms = int(time.time() * 1000)
        d.start(listen=d.listen)
        assert int(q.get(f"{{{namespace}}}:generation")) > gen  # tokens start above every earlier one
        assert int(q.hget(f"{{{namespace}}}:daemon", "hold_until") or 0) > started_ms
        assert "event=redis.failover" in d.daemon_log()
    finally:
        d.cleanup()
        primary.stop(kill=True)
        replica.stop(kill=True)
