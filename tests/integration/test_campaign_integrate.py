"""Taking a run in (`campaigns.integrate`, the background task) against a real Redis and a real CAS, in-process:
it is idempotent, and a run whose bundle is gone from the CAS is said once, on the run, and not retried forever."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import redis

from piloop_common import gitrepo
from piloop_common.cas import open_store
from piloop_common.config.load import load_settings
from piloop_common.protocol.campaign import CampaignCreate
from piloop_common.protocol.worker import CampaignJob, JobSpec, RepoSpec
from piloop_server import campaign_admin, campaign_repo, campaigns
from piloop_server.runtime import Runtime
from tests.integration.test_campaigns import GIT_ENV, make_repo


@pytest.fixture
def rt(redis_server, namespace, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text(f'namespace = "{namespace}"\n[plugins.state]\nurl = "{redis_server.url}"\n')
    settings = load_settings(home, env={})
    store = open_store(settings.plugins.cas, home)
    client = redis.Redis.from_url(redis_server.url)
    client.set(f"{{{namespace}}}:generation", 1)
    yield Runtime(settings=settings, home=home, redis=client, store=store, cas_id=store.identity())
    client.close()


def _finished_run(rt: Runtime, name: str, job: str, *, bundle: str | None, head: str, base: str) -> None:
    """An agent job of the campaign that succeeded with this head and bundle, as report.lua leaves it."""
    spec = JobSpec(
        argv=["true"],
        campaign=CampaignJob(
            repo=RepoSpec(campaign=name, bundle="sha256:" + "0" * 64, commit=base, branch=f"runs/{job}"), collect=True
        ),
    )
    rt.leases.enqueue(job, "agent", "serve", spec.model_dump(mode="json"), by="test", campaign=name)
    rt.redis.hset(
        rt.keys.job(job),
        mapping={"state": "succeeded", "result": json.dumps({"head": head, "bundle": bundle, "workspace": None})},
    )
    rt.redis.zadd(rt.keys.campaign_runs(name), {job: 1})
    rt.redis.sadd(rt.keys.campaign_pending(), job)


def test_taking_a_run_in_twice_is_one_branch_and_one_evaluation(rt, tmp_path):
    base = make_repo(tmp_path / "repo", big=10)
    campaign_admin.create(
        rt,
        CampaignCreate(
            name="c",
            repo=str(tmp_path / "repo"),
            agent_cmd="true",
            eval_cmd="true",
            agents=0,
            eval_memory_mb=512,
            eval_max_attempts=2,
        ),
        by="test",
    )
    work = tmp_path / "work"
    subprocess.run(["git", "clone", "-q", str(tmp_path / "repo"), str(work)], check=True)
    (work / "runs.txt").write_text("one\n")
    env = {**os.environ, **GIT_ENV}
    subprocess.run(["git", "commit", "-qam", "one"], cwd=work, check=True, env=env)
    head = gitrepo.git("rev-parse", "HEAD", cwd=work).strip()
    assert gitrepo.bundle(work, tmp_path / "run.bundle", ["HEAD", f"^{base}"])
    bundle = rt.store.put_file(tmp_path / "run.bundle")
    _finished_run(rt, "c", "jaaaaaaaaaaaa", bundle=bundle, head=head, base=base)

    assert campaigns.integrate(rt, "jaaaaaaaaaaaa") == "evaluation queued"
    assert not rt.redis.sismember(rt.keys.campaign_pending(), "jaaaaaaaaaaaa")
    # a retried task (the first one's answer lost) changes nothing
    assert campaigns.integrate(rt, "jaaaaaaaaaaaa") == "evaluation queued"
    repo = campaign_repo.repo_dir(rt, "c")
    assert gitrepo.git("rev-parse", "runs/jaaaaaaaaaaaa", cwd=repo).strip() == head
    ev = campaigns.eval_id("jaaaaaaaaaaaa")
    queued = [j.decode() for j in rt.redis.zrange(rt.keys.queue("serve", "evaluation"), 0, -1)]
    assert queued == [ev]
    spec = JobSpec.model_validate_json(rt.redis.hget(rt.keys.job(ev), "spec"))
    assert spec.campaign is not None and spec.campaign.repo.commit == head and spec.campaign.score
    assert spec.memory_mb == 512 and spec.max_attempts == 2  # the campaign's evaluation spec


def test_a_run_whose_bundle_left_the_cas_is_reported_once_and_not_retried(rt, tmp_path):
    base = make_repo(tmp_path / "repo", big=10)
    campaign_admin.create(
        rt,
        CampaignCreate(name="c", repo=str(tmp_path / "repo"), agent_cmd="true", eval_cmd="true", agents=0),
        by="test",
    )
    missing = "sha256:" + "1" * 64  # accepted at report time, deleted from the CAS since
    _finished_run(rt, "c", "jbbbbbbbbbbbb", bundle=missing, head="2" * 40, base=base)
    assert campaigns.integrate(rt, "jbbbbbbbbbbbb") == "failed"
    assert not rt.redis.sismember(rt.keys.campaign_pending(), "jbbbbbbbbbbbb")  # not handed on again
    (esc,) = [e for e in rt.events.inbox() if e.get("what") == "campaign.run_not_taken"]
    assert "jbbbbbbbbbbbb" in esc["message"]
    (run,) = campaign_admin.view(rt, "c").runs
    assert run.reason and run.evaluation == "" and run.score is None
    assert rt.redis.zcard(rt.keys.queue("serve", "evaluation")) == 0


def test_a_job_labelled_with_a_campaign_that_is_not_one_is_not_handed_to_the_background(rt):
    rt.leases.enqueue("jcccccccccccc", "agent", "serve", {"argv": ["true"]}, by="test", campaign="just-a-label")
    rt.redis.hset(rt.keys.job("jcccccccccccc"), "state", "succeeded")
    rt.redis.sadd(rt.keys.campaign_pending(), "jcccccccccccc")
    campaigns.tend(rt)  # no rq worker needed: it is dropped from the set in the pass
    assert not rt.redis.exists(rt.keys.campaign_pending())
    assert not rt.redis.keys(rt.keys.rq_prefix() + "*")
