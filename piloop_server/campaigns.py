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
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from piloop_common import gitrepo, workspace
from piloop_common.errors import BadAddress, BadRequest, BlobMissing, Conflict, Corrupt, NotFound
from piloop_common.protocol import (
    TERMINAL_STATES,
    CampaignCreate,
    CampaignJob,
    CampaignView,
    JobSpec,
    RepoSpec,
    RunView,
)
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


# -- create -------------------------------------------------------------------------------------


def _check(rt: Runtime, req: CampaignCreate) -> None:
    pools = rt.executor.pools
    for flag, pool in (("--agent-pool", req.agent_pool), ("--eval-pool", req.eval_pool)):
        if pool not in pools:
            raise BadRequest(f"{flag} {pool}: no such pool (pools: {', '.join(sorted(pools))})")
    if req.secrets:
        missing = sorted(set(req.secrets) - rt.secrets.names())
        if missing:
            raise BadRequest(f"--secret: no secret named {', '.join(missing)} (`piloop secret list`)")
    if req.workspace is not None and not Path(req.workspace).is_dir():
        raise BadRequest(f"--workspace {req.workspace}: not a directory on the server's host")
    if rt.campaigns.exists(req.name):
        raise Conflict(f"campaign {req.name} exists (`piloop campaign rm {req.name}` first)")


def create(rt: Runtime, req: CampaignCreate, by: str) -> CampaignView:
    """Clone, bundle and record a campaign; on any bad input nothing is created (blobs aside, by address)."""
    _check(rt, req)
    src = req.repo
    if "://" not in src and not src.startswith("git@") and not Path(src).exists():
        raise BadRequest(f"--repo {src}: no such path on the server's host")
    final = repo_dir(rt, req.name)
    final.parent.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = final.parent.parent / f".{req.name}.{uuid.uuid4().hex[:8]}"
    try:
        try:
            gitrepo.git("clone", "-q", "--bare", src, str(tmp / "repo.git"))
        except gitrepo.GitError as e:
            raise BadRequest(f"--repo {src}: not a git repo git can clone ({e.message})") from None
        repo = tmp / "repo.git"
        try:
            base = gitrepo.git("rev-parse", "--verify", "HEAD^{commit}", cwd=repo).strip()
        except gitrepo.GitError:
            raise BadRequest(f"--repo {src}: the repo has no commit on its HEAD branch") from None
        head_branch = gitrepo.git("symbolic-ref", "--short", "HEAD", cwd=repo, check=False).strip() or "HEAD"
        bundle_path = tmp / "all.bundle"
        gitrepo.bundle(repo, bundle_path, ["--branches", "HEAD"])
        bundle = rt.store.put_file(bundle_path)
        size = bundle_path.stat().st_size
        bundle_path.unlink()
        manifest = workspace.snapshot(Path(req.workspace), rt.store) if req.workspace else {}
        ws = workspace.save(manifest, rt.store)
        if not rt.campaigns.reserve(req.name):
            raise Conflict(f"campaign {req.name} exists (`piloop campaign rm {req.name}` first)")
        if final.parent.exists():
            shutil.rmtree(final.parent)  # what a removed campaign of this name left
        tmp.rename(final.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rt.campaigns.put(
        Campaign(
            name=req.name,
            state="active",
            repo=src,
            base=base,
            branch=head_branch,
            bundle=bundle,
            bundle_bytes=size,
            agent_cmd=req.agent_cmd,
            eval_cmd=req.eval_cmd,
            agents=req.agents,
            agent_pool=req.agent_pool,
            eval_pool=req.eval_pool,
            workspace=ws,
            workspace_files=len(manifest),
            agent_spec=_spec(req, agent=True),
            eval_spec=_spec(req, agent=False),
            created=int(time.time() * 1000),
            by=by,
        )
    )
    rt.events.add(
        "campaign.created",
        by,
        campaign=req.name,
        repo=src,
        base=base,
        bundle=bundle,
        bundle_bytes=str(size),
        agents=str(req.agents),
    )
    return view(rt, req.name)


def _spec(req: CampaignCreate, agent: bool) -> str:
    """The JobSpec every agent (or evaluation) of the campaign starts from, as JSON."""
    if agent:
        spec = JobSpec(
            argv=["sh", "-c", req.agent_cmd],
            timeout_seconds=req.agent_timeout_seconds,
            env=dict(req.env),
            secrets=list(req.secrets),
            memory_mb=req.agent_memory_mb,
        )
    else:
        spec = JobSpec(
            argv=["sh", "-c", req.eval_cmd],
            timeout_seconds=req.eval_timeout_seconds,
            memory_mb=req.eval_memory_mb,
            max_attempts=req.eval_max_attempts,
        )
    return spec.model_dump_json(exclude_none=True)


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


# -- reading, pausing, removing -----------------------------------------------------------------


def names(rt: Runtime) -> list[str]:
    return rt.campaigns.names()


def view(rt: Runtime, name: str, runs: bool = True) -> CampaignView:
    rec = record(rt, name)
    states = rt.jobs.field_of(rt.campaigns.agents(name), "state")
    scores = rt.campaigns.scores(name)
    out = CampaignView(
        name=name,
        state=rec.state,
        repo=rec.repo,
        base=rec.base,
        bundle=rec.bundle,
        bundle_bytes=rec.bundle_bytes,
        agent_cmd=rec.agent_cmd,
        eval_cmd=rec.eval_cmd,
        agents=rec.agents,
        agent_pool=rec.agent_pool,
        eval_pool=rec.eval_pool,
        workspace=rec.workspace,
        workspace_files=rec.workspace_files,
        live=sum(1 for s in states if s in ("leased", "running")),
        queued=sum(1 for s in states if s == "queued"),
        created_ms=rec.created,
        by=rec.by,
        best=max(scores.values()) if scores else None,
    )
    if runs:
        out.runs = _runs(rt, name, scores)
    return out


def summary(rt: Runtime, top: int = 3) -> list[dict[str, Any]]:
    """Each campaign for `piloop status`: its agents, how many runs, and its best runs by score."""
    out = []
    for name in names(rt):
        c = view(rt, name, runs=False)
        out.append(
            {
                "name": name,
                "state": c.state,
                "live": c.live,
                "queued": c.queued,
                "target": c.agents,
                "runs": rt.campaigns.run_count(name),
                "best": [{"branch": f"runs/{r}", "score": s} for r, s in rt.campaigns.best(name, top)],
            }
        )
    return out


def _runs(rt: Runtime, name: str, scores: dict[str, float]) -> list[RunView]:
    ids = rt.campaigns.runs(name)
    got = rt.jobs.get_many([x for j in ids for x in (j, eval_id(j))])
    out = []
    for i, j in enumerate(ids):
        run, ev = got[2 * i], got[2 * i + 1]
        if run is None:
            continue
        ev_state, ev_reason = (ev.state, ev.reason) if ev is not None else ("", "")
        camp = run.spec_dict().get("campaign") or {}
        out.append(
            RunView(
                job=j,
                state=run.state,
                branch=f"runs/{j}",
                worker=run.worker,
                base=(camp.get("repo") or {}).get("commit", ""),
                head=run.result_dict().get("head") or "",
                evaluation=eval_id(j) if ev_state else "",
                evaluation_state=ev_state,
                score=scores.get(j),
                reason=run.campaign_error or (ev_reason if ev_state == "failed" else run.reason),
                created_ms=run.created,
            )
        )
    # scored runs first, best first; then the rest, newest first
    out.sort(key=lambda r: (r.score is None, -(r.score or 0.0), -r.created_ms))
    return out


def set_state(rt: Runtime, name: str, state: str, by: str) -> CampaignView:
    """Pause (launch no agent, withdraw the queued ones; live agents run to their end) or resume."""
    record(rt, name)
    rt.campaigns.set_state(name, state)
    if state == "paused":
        for j in rt.campaigns.agents(name):
            rt.leases.cancel(j, by, only_queued=True)  # one leased meanwhile runs on
    rt.events.add(f"campaign.{'paused' if state == 'paused' else 'resumed'}", by, campaign=name)
    return view(rt, name, runs=False)


def remove(rt: Runtime, name: str, by: str, force: bool) -> list[str]:
    """Forget a campaign; its jobs stay listed, its blobs stay in the CAS. Refused while it has agents that have
    not ended, unless `force`, which cancels them."""
    record(rt, name)
    n, _ = rt.leases.launch(name, "-", "-", None, by=by)
    cancelled = []
    if n:
        if not force:
            raise Conflict(
                f"campaign {name} has {n} agent(s) not ended: `piloop campaign pause {name}` and wait, "
                "or `--force` to cancel them"
            )
        rt.campaigns.set_state(name, "paused")
        agents = rt.campaigns.agents(name)
        for j, state in zip(agents, rt.jobs.field_of(agents, "state"), strict=True):
            if state not in TERMINAL_STATES:
                rt.leases.cancel(j, by)
                cancelled.append(j)
    rt.campaigns.forget(name)
    shutil.rmtree(repo_dir(rt, name).parent, ignore_errors=True)
    rt.events.add("campaign.removed", by, campaign=name, cancelled=",".join(cancelled))
    return cancelled
