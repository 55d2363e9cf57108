"""Retention, for real: a `piloop serve` whose jobs end under a retention of seconds, and the keys counted in Redis.

A succeeded or cancelled job leaves Redis `finished_seconds` after it ended, a failed one `failed_seconds` after;
a campaign's ended jobs stay while the campaign exists and go once it is removed; events go past their age.
"""

from __future__ import annotations

import json
import time

import pytest

from piloop_server.state.campaigns import CampaignsState
from piloop_server.state.keys import Keys
from piloop_server.state.leases import LeasesState
from piloop_server.state.records.campaign import Campaign
from piloop_server.state.records.lease import Timings
from piloop_server.state.retention import Horizons, RetentionState
from tests.helpers.redis import wait_for
from tests.helpers.serve import FAST_EXECUTOR, Daemon, short_home
from tests.helpers.workers import state, submit

# long enough that a job is still there when the test, submitting the others one CLI process at a time on a loaded
# machine, first looks at it
FINISHED, FAILED = 10, 18
RETENTION = f"\n[plugins.retention]\nfinished_seconds = {FINISHED}\nfailed_seconds = {FAILED}\n"


@pytest.fixture
def retaining(redis_server, namespace):
    d = Daemon(short_home(), config=FAST_EXECUTOR + RETENTION, redis_url=redis_server.url, namespace=namespace)
    d.start()
    yield d
    d.cleanup()


def _job_keys(r, keys: Keys, job: str) -> list[bytes]:
    """Every key of the job itself, and the indexes that name it."""
    own = sorted(r.scan_iter(match=keys.job(job).replace("{", "\\{").replace("}", "\\}") + "*"))
    named = [k.encode() for k in (keys.jobs(), keys.ended(), keys.ended_kept()) if r.zscore(k, job) is not None]
    return own + named


def test_ended_jobs_leave_redis_past_their_horizon_and_job_show_says_why(retaining, redis_client, namespace):
    d, keys = retaining, Keys(namespace)
    ok = [submit(d, "sh", "-c", "echo done", pool="serve") for _ in range(3)]
    bad = submit(d, "false", pool="serve", opts=("--max-attempts", "1"))
    views = [state(d, j) for j in ok]
    assert [v["state"] for v in views] == ["succeeded"] * 3
    failed = state(d, bad)
    assert failed["state"] == "failed"
    last_ok_ms = max(v["updated_ms"] for v in views)  # when each ended, on the server's clock (this machine's)

    def since(ms: int) -> float:
        return time.time() - ms / 1000

    for j in [*ok, bad]:
        held = _job_keys(redis_client, keys, j)
        assert keys.job(j).encode() in held and keys.ended().encode() in held, held
    # the succeeded ones go after `finished_seconds`; the failed one is still whole then
    wait_for(
        lambda: all(not _job_keys(redis_client, keys, j) for j in ok), FINISHED + 10, interval=0.2, what="the prune"
    )
    assert since(last_ok_ms) >= FINISHED - 1  # not before their time
    if since(failed["updated_ms"]) < FAILED - 1:
        assert keys.job(bad).encode() in _job_keys(redis_client, keys, bad)
    wait_for(lambda: not _job_keys(redis_client, keys, bad), FAILED + 10, interval=0.2, what="the failed job's prune")
    assert since(failed["updated_ms"]) >= FAILED - 1
    # nothing of them is left: no key of a job, no index naming one (a report's answer went with its job's hash)
    assert not redis_client.zcard(keys.ended()) and not redis_client.zcard(keys.ended_kept())
    got = d.cli("job", "show", ok[0])
    assert got.returncode != 0 and len(got.stderr.strip().splitlines()) == 1, got.stderr
    assert f"no job {ok[0]}" in got.stderr and "[plugins.retention] finished_seconds" in got.stderr, got.stderr
    assert "Traceback" not in got.stderr


def test_a_campaigns_ended_jobs_stay_while_it_exists_and_go_once_it_is_removed(redis_client, namespace):
    keys = Keys(namespace)
    leases = LeasesState(redis_client, keys, Timings(2000, 6000))
    retention = RetentionState(redis_client, keys)
    campaigns = CampaignsState(redis_client, keys)
    campaigns.reserve("c1")
    campaigns.put(
        Campaign(
            name="c1",
            state="active",
            repo="r",
            base="b" * 40,
            branch="main",
            bundle="",
            bundle_bytes=0,
            agent_cmd="a",
            eval_cmd="e",
            agents=1,
            agent_pool="p",
            eval_pool="p",
            workspace="",
            workspace_files=0,
            agent_spec="{}",
            eval_spec="{}",
            created=0,
            by="admin",
        )
    )
    for job, campaign in (("jc1aaaaaaaaaa", "c1"), ("jc1bbbbbbbbbb", "c1"), ("jplainaaaaaaa", "")):
        leases.enqueue(job, "evaluation", "p", {"argv": ["true"]}, by="admin", campaign=campaign)
        assert leases.cancel(job, "admin") == "cancelled"
    # a log and notes of its own, as a job that ran would have
    redis_client.rpush(keys.job_log("jplainaaaaaaa"), "sha256:" + "0" * 64)
    redis_client.rpush(keys.job_progress("jplainaaaaaaa"), "{}")
    horizons = Horizons(finished_ms=1, failed_ms=None)
    wait_for(lambda: retention.prune(horizons).removed == 1 or None, 5, what="the plain job's prune")
    assert not redis_client.exists(
        keys.job("jplainaaaaaaa"), keys.job_log("jplainaaaaaaa"), keys.job_progress("jplainaaaaaaa")
    )
    assert redis_client.zscore(keys.jobs(), "jplainaaaaaaa") is None
    # the campaign's two are past their horizon, kept for it, and read no more by the prune
    assert redis_client.exists(keys.job("jc1aaaaaaaaaa"), keys.job("jc1bbbbbbbbbb")) == 2
    assert redis_client.scard(keys.campaign_kept("c1")) == 2 and not redis_client.zcard(keys.ended())
    assert retention.prune(horizons).removed == 0
    campaigns.forget("c1")
    assert retention.release_campaign("c1") == 2
    assert retention.prune(horizons).removed == 2
    assert not redis_client.exists(keys.job("jc1aaaaaaaaaa"), keys.job("jc1bbbbbbbbbb"), keys.campaign_kept("c1"))


@pytest.mark.parametrize(
    "finished, failed, split",
    [
        (7, 30, (7, ("succeeded", "cancelled", "expired"), 30)),
        (30, 7, (7, ("failed", "lost", "worker_lost"), 30)),
        (7, 7, (7, ("succeeded", "cancelled", "expired", "failed", "lost", "worker_lost"), -1)),
        (0, 7, (7, ("failed", "lost", "worker_lost"), -1)),
        (7, 0, (7, ("succeeded", "cancelled", "expired"), -1)),
        (0, 0, None),
    ],
)
def test_the_horizons_split_into_a_shorter_and_a_longer(finished, failed, split):
    h = Horizons(finished_ms=finished or None, failed_ms=failed or None)
    assert h.split() == split


def test_events_older_than_their_age_are_trimmed(redis_client, namespace):
    keys = Keys(namespace)
    retention = RetentionState(redis_client, keys)
    redis_client.xadd(keys.events(), {"type": "old"}, id="1000-0")  # 1970: older than any age
    redis_client.xadd(keys.events(), {"type": "new"})
    retention.trim_events(60_000)
    assert [f[b"type"] for _, f in redis_client.xrange(keys.events())] == [b"new"]


def test_used_memory_past_the_alarms_share_is_one_inbox_item_until_it_falls_back(tmp_path):
    """On a redis-server of the test's own: its maxmemory set just above, then far above, what it holds."""
    import types

    import redis

    from piloop_server.daemon import Pass
    from piloop_server.state.events import EventsState
    from tests.helpers.redis import redis_process

    with redis_process(tmp_path) as rp:
        r = redis.Redis.from_url(rp.url)
        keys = Keys("mem")
        rt = types.SimpleNamespace(retention=RetentionState(r, keys), events=EventsState(r, keys))
        p = Pass.__new__(Pass)  # only watch_memory's part of a pass: no daemon around it
        p.rt = rt
        # ballast, so the share's headroom (a tenth) is megabytes: Redis 7 grows ~50 KB on its own between two calls;
        # appended 256 KiB at a time, since one 20 MiB SET leaves a query buffer as large that Redis frees a moment
        # later (its used memory then falls by half, under the share)
        for _ in range(80):
            r.append("mem-ballast", b"x" * (256 << 10))
        used = rt.retention.memory().used
        r.config_set("maxmemory", int(used / 0.9))
        p.watch_memory()
        p.watch_memory()  # still over: no second item
        items = [i for i in rt.events.inbox() if i["what"] == "redis.memory"]
        assert len(items) == 1 and "maxmemory" in items[0]["message"], items
        r.config_set("maxmemory", used * 100)
        p.watch_memory()  # fell back under the share: the alarm re-arms, no item
        r.config_set("maxmemory", int(rt.retention.memory().used / 0.9))
        p.watch_memory()
        assert len([i for i in rt.events.inbox() if i["what"] == "redis.memory"]) == 2


def test_status_shows_redis_memory_and_the_jobs_retention_keeps(retaining):
    out = retaining.cli("status", check=True).stdout
    line = next(ln for ln in out.splitlines() if "MiB used" in ln)
    assert "ended jobs kept, pruned every pass" in line and f"finished {FINISHED:g} s" in line, line
    cas = next(ln for ln in out.splitlines() if ln.startswith("cas "))
    # none has run: the first is a day (cas_gc_seconds) after the daemon started
    assert "garbage collection never, next in 23h" in cas or "next in 1d" in cas, cas
    got = json.loads(retaining.cli("status", "--json", check=True).stdout)["cas_gc"]
    assert got["last_ms"] is None and got["next_ms"] > time.time() * 1000 + 86_000_000, got


def test_two_prunes_at_once_remove_each_job_once(redis_server, redis_client, namespace):
    """Two daemons' passes prune at the same moment, each on a connection of its own, in batches smaller than the
    backlog: every job is removed by exactly one of them, and no key of any is left."""
    import threading

    import redis

    keys = Keys(namespace)
    leases = LeasesState(redis_client, keys, Timings(2000, 6000))
    jobs = [f"jtwo{i:09d}" for i in range(300)]
    for job in jobs:
        leases.enqueue(job, "evaluation", "p", {"argv": ["true"]}, by="admin")
        assert leases.cancel(job, "admin") == "cancelled"
    horizons = Horizons(finished_ms=1, failed_ms=None)
    wait_for(lambda: time.time() * 1000 > int(redis_client.hget(keys.job(jobs[-1]), "ended")) + 1, 5, what="1 ms")
    removed = [0, 0]
    start = threading.Barrier(2)

    def pruner(i: int) -> None:
        r = redis.Redis.from_url(redis_server.url)
        retention = RetentionState(r, keys)
        start.wait()
        while (got := retention.prune(horizons, batch=7)).removed or got.moved:
            removed[i] += got.removed
        r.close()

    threads = [threading.Thread(target=pruner, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sum(removed) == len(jobs), f"a job removed twice, or not at all: {removed}"
    assert not any(_job_keys(redis_client, keys, j) for j in jobs)
    assert RetentionState(redis_client, keys).retained() == 0


# succeeded jobs go after 2 s; a report answer kept apart from its job would stay as long as the failed ones (30 days)
SHORT = "\n[plugins.retention]\nfinished_seconds = 2\n"


def test_a_reports_answer_lives_with_its_job_and_leaves_with_it(redis_server, redis_client, namespace):
    """A report's answer is kept in its job's hash (test_leases.py), so nothing of the report is left once retention
    removed the job: jobs run by the daemon's own worker leave Redis with the keys it held before them."""
    from tests.helpers.keyspace import DAEMON_CHURN, keyspace, settled

    keys = Keys(namespace)
    d = Daemon(short_home(), config=FAST_EXECUTOR + SHORT, redis_url=redis_server.url, namespace=namespace)
    d.start()
    try:

        def pruned(jobs: list[str]) -> bool:
            return not any(_job_keys(redis_client, keys, j) for j in jobs)

        def succeeded() -> set[str]:
            return {
                e[b"job"].decode()
                for _, e in redis_client.xrange(keys.events())
                if e.get(b"type") == b"job.succeeded" and b"job" in e
            }

        # the first job makes what every later one shares (the token counter); the events say each job's end, as a
        # job view cannot once its job is gone
        first = submit(d, "true", pool="serve")
        wait_for(lambda: first in succeeded() and pruned([first]), 60, interval=0.2, what="the first job's prune")
        before = set(settled(redis_client, keys))
        jobs = [submit(d, "true", pool="serve") for _ in range(8)]
        wait_for(lambda: set(jobs) <= succeeded(), 90, interval=0.2, what="the jobs to succeed")
        wait_for(lambda: pruned(jobs), 60, interval=0.2, what="the jobs' prune")
        after = set(keyspace(redis_client, keys, DAEMON_CHURN))
        assert after == before, (sorted(after - before)[:10], sorted(before - after)[:10])
        assert not [
            k for k in redis_client.scan_iter(match=keys.prefix().replace("{", "\\{").replace("}", "\\}") + "report:*")
        ]
    finally:
        d.cleanup()


def test_a_child_submitted_after_its_parent_ended_leaves_no_children_set_behind(retaining, redis_client, namespace):
    """The dependency pass reads a parent's `children` set once the parent ended, and deletes it; a child submitted
    after the pass read past its parent is settled at its submission, and must not leave a set no pass reads again
    (it would outlive the parent's prune: a key a dependency, forever)."""
    d, keys = retaining, Keys(namespace)
    parent = submit(d, "true", pool="serve")
    assert state(d, parent)["state"] == "succeeded"
    ended_at = float(redis_client.zscore(keys.ended(), parent) or 0)
    fillers: list[str] = []

    def read_past_parent() -> bool:
        if float(redis_client.get(keys.dependencies_cursor()) or 0) > ended_at:
            return True
        fillers.append(submit(d, "true", pool="serve"))  # a later end moves the pass's cursor on
        return False

    wait_for(read_past_parent, 60, interval=1.0, what="the dependency pass to read past the parent")
    child = submit(d, "true", pool="serve", opts=("--after", parent))
    assert state(d, child)["state"] == "succeeded"
    assert not redis_client.exists(keys.job_children(parent))
