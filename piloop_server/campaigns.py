"""Campaigns: a git repo, a shared workspace, an agent and an evaluation command, and a target of live agents.

The server keeps each campaign's bare repo under `$PILOOP_HOME/campaigns/<name>/repo.git` and builds its bundle
once, into the CAS. Each pass (`tend`) keeps every active campaign at its target, launching agents only into free
slots of the agent pool and each to the campaign with the fewest agents. A run that succeeded is taken in off the
pass (`integrate`, an rq task): its commits become the branch `runs/<job>`, its workspace writes are folded into
the workspace, and an evaluation of its head is queued; an evaluation that succeeded records the run's score.
"""

from __future__ import annotations

import hashlib
import logging
import tempfile
import time
from pathlib import Path
from typing import Any

from piloop_common import gitrepo
from piloop_common.cas import workspace
from piloop_common.errors import BadAddress, BlobMissing, Conflict, Corrupt, NotFound
from piloop_common.protocol.worker import CampaignJob, JobSpec, RepoSpec
from piloop_server.campaign_repo import repo_dir
from piloop_server.jobs import new_id
from piloop_server.runtime import Runtime
from piloop_server.state.records.campaign import Campaign

log = logging.getLogger("piloop.campaigns")

INTEGRATE_BATCH = 100


def eval_id(run: str) -> str:
    """The evaluation of a run has an id made from the run's, so queueing it twice is one job."""
    return "j" + hashlib.sha256(f"evaluation:{run}".encode()).hexdigest()[:12]


def relayed_eval_id(run: str, commit: str) -> str:
    """An evaluation an agent asked for through its relay: one job per run and commit, however often asked."""
    return "j" + hashlib.sha256(f"relayed-evaluation:{run}:{commit}".encode()).hexdigest()[:12]


def evaluation_spec(rec: Campaign, commit: str, run: str) -> JobSpec:
    """The campaign's evaluation of `commit` for the run `run`: its eval spec, scored, at that commit."""
    ev = JobSpec.model_validate_json(rec.eval_spec)
    ev.campaign = CampaignJob(
        repo=RepoSpec(campaign=rec.name, bundle=rec.bundle, commit=commit, branch=f"runs/{run}"), score=True
    )
    return ev


def record(rt: Runtime, name: str) -> Campaign:
    rec = rt.campaigns.get(name)
    if rec is None:
        raise NotFound(f"no campaign named {name} (`piloop campaign list`)")
    return rec


# -- the pass: keep each campaign at its target -------------------------------------------------


def _free_agent_slots(rt: Runtime) -> dict[str, int]:
    """Per pool, the agent slots no agent holds or waits for: reachable, undrained workers (a provisioned pool:
    its `max` workers, which it starts for waiting agents)."""
    cap: dict[str, int] = {}
    for w in rt.workers.all():
        cfg = rt.executor.pools.get(w.pool)
        if cfg is not None and w.alive and not w.draining:
            cap[w.pool] = cap.get(w.pool, 0) + cfg.agents
    counts = rt.jobs.counts(sorted(rt.executor.pools), ("agent",))
    free = {}
    for pool, cfg in rt.executor.pools.items():
        total = cfg.provisioner.max * cfg.agents if cfg.provisioner is not None else cap.get(pool, 0)
        queued, running = counts[(pool, "agent")]
        free[pool] = max(0, total - queued - running)
    return free


def _start_commit(rt: Runtime, rec: Campaign) -> str:
    """A new agent starts from the best-scored run so far, else from the campaign's base."""
    for run, _ in rt.campaigns.best(rec.name, 1):
        job = rt.jobs.get(run)
        head = str(job.result_dict().get("head") or "") if job is not None else ""
        if head:
            return head
    return rec.base


def tend(rt: Runtime) -> int:
    """Launch agents where campaigns are under target and slots are free; hand finished runs to the background.
    Returns how many agents it launched."""
    recs: dict[str, Campaign] = {}
    count = {}
    for name in rt.campaigns.names():
        rec = rt.campaigns.get(name)
        if rec is None:
            continue
        n, _ = rt.leases.launch(name, "-", rec.agent_pool, None, by="service:daemon")
        count[name] = n
        if rec.state == "active" and n < rec.agents:
            recs[name] = rec
    launched = 0
    if recs:
        free = _free_agent_slots(rt)
        last = {name: rt.campaigns.newest_run_ms(name) for name in recs}
        while recs:
            # the campaign with the fewest agents first, into a free slot of its pool; on a tie, the one that
            # launched longest ago, so campaigns sharing one slot take turns
            name = min(recs, key=lambda c: (count[c], last[c], c))
            rec = recs[name]
            pool = rec.agent_pool
            if free.get(pool, 0) <= 0:
                recs.pop(name)
                continue
            job = new_id()
            spec = JobSpec.model_validate_json(rec.agent_spec)
            spec.campaign = CampaignJob(
                repo=RepoSpec(campaign=name, bundle=rec.bundle, commit=_start_commit(rt, rec), branch=f"runs/{job}"),
                workspace=rec.workspace or None,
                collect=True,
            )
            n, did = rt.leases.launch(
                name, job, pool, spec.model_dump(mode="json", exclude_none=True), by="service:daemon"
            )
            count[name] = n
            if not did:
                recs.pop(name)
                continue
            launched += 1
            free[pool] -= 1
            last[name] = time.time() * 1000
            if n >= rec.agents:
                recs.pop(name)
    _hand_off(rt)
    return launched


def _hand_off(rt: Runtime) -> None:
    from piloop_server import tasks  # the rq side; imported here so that the pass's module stays light

    pending = rt.campaigns.pending(INTEGRATE_BATCH)
    for job, campaign in zip(pending, rt.jobs.field_of(pending, "campaign"), strict=True):
        if not campaign or not rt.campaigns.exists(campaign):
            # a job labelled with a campaign that is not one (`job submit --campaign`) has nothing to take in
            rt.campaigns.taken_in(job)
            continue
        # once per key while one is queued or running; after it ends, the job is out of the set
        tasks.submit(rt, "piloop_server.campaigns:integrate", job, key=f"campaign.integrate:{job}")


# -- integrating a finished run or evaluation (a background task: idempotent) ------------------


def integrate(rt: Runtime, job_id: str) -> str:
    """Take in one succeeded campaign job: a run's commits, workspace writes and evaluation, or an evaluation's
    score. Safe to run again: every step is keyed by the job."""
    job = rt.jobs.get(job_id)
    rec = rt.campaigns.get(job.campaign) if job is not None and job.campaign else None
    if job is None or rec is None:
        rt.campaigns.taken_in(job_id)
        return "gone"
    name = rec.name
    result = job.result_dict()
    spec = JobSpec.model_validate_json(job.spec)
    what = "nothing"
    if job.kind == "agent":
        try:
            what = _take_run(rt, rec, job_id, spec, result)
        except (gitrepo.GitError, BlobMissing, Corrupt, BadAddress, ValueError) as e:
            # retrying cannot help (a bad bundle, a blob deleted since the report): say so once, on the run
            why = getattr(e, "message", None) or str(e)
            rt.jobs.set_campaign_error(job_id, why[:500])
            rt.events.escalate(
                "campaign.run_not_taken",
                f"run {job_id} of campaign {name} could not be taken in: {why}",
                campaign=name,
                job=job_id,
            )
            what = "failed"
    elif (
        spec.campaign is not None
        and spec.campaign.score
        and result.get("score") is not None
        and job_id == eval_id(spec.campaign.repo.branch.removeprefix("runs/"))
    ):
        # a run is ranked by the evaluation of the head it brought back, never by one its agent asked for
        run = spec.campaign.repo.branch.removeprefix("runs/")
        rt.campaigns.score(name, run, float(result["score"]))
        rt.events.add(
            "campaign.scored", "service:daemon", campaign=name, run=run, job=job_id, score=repr(float(result["score"]))
        )
        what = "scored"
    rt.campaigns.taken_in(job_id)
    return what


def _take_run(rt: Runtime, rec: Campaign, job_id: str, spec: JobSpec, result: dict[str, Any]) -> str:
    name = rec.name
    repo = repo_dir(rt, name)
    head, bundle = result.get("head") or "", result.get("bundle")
    base = spec.campaign.repo.commit if spec.campaign else rec.base
    if bundle and head and not gitrepo.has_commit(repo, head):
        with tempfile.TemporaryDirectory(dir=repo.parent) as d:
            path = Path(d) / "run.bundle"
            rt.store.get_file(bundle, path)
            gitrepo.fetch_bundle(repo, path, f"HEAD:refs/heads/runs/{job_id}")
    if head and gitrepo.has_commit(repo, head):
        gitrepo.git("update-ref", f"refs/heads/runs/{job_id}", head, cwd=repo)
    if result.get("workspace"):
        _fold_workspace(rt, name, result["workspace"])
    if not head or head == base:
        rt.events.add("campaign.run_empty", "service:daemon", campaign=name, run=job_id)
        return "no commits"
    ev = evaluation_spec(rec, head, job_id)
    try:
        rt.leases.enqueue(
            eval_id(job_id),
            "evaluation",
            rec.eval_pool,
            ev.model_dump(mode="json", exclude_none=True),
            by="service:daemon",
            campaign=name,
        )
    except Conflict:
        pass  # queued by an earlier try of this task
    return "evaluation queued"


def _fold_workspace(rt: Runtime, name: str, writes_addr: str) -> None:
    writes = workspace.load(writes_addr, rt.store)

    def fold(old: str) -> tuple[str, int]:
        merged = workspace.merge(workspace.load(old, rt.store), writes)
        return workspace.save(merged, rt.store), len(merged)

    if not rt.campaigns.fold_workspace(name, fold):
        raise Conflict(f"campaign {name}: the workspace kept changing while a run's writes were folded in")
