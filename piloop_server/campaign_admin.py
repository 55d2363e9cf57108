"""Creating, reading, pausing and removing campaigns: what `piloop campaign …` and `piloop status` ask of them.

The pass side (keeping each campaign at its target, taking finished runs in) is piloop_server/campaigns.py.
"""

from __future__ import annotations

import re
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

from piloop_common import gitrepo
from piloop_common.cas import workspace
from piloop_common.errors import BadRequest, Conflict
from piloop_common.protocol.campaign import CampaignCreate, CampaignView, RunView
from piloop_common.protocol.worker import TERMINAL_STATES, JobSpec
from piloop_server.campaign_repo import repo_dir
from piloop_server.campaigns import eval_id, record
from piloop_server.runtime import Runtime
from piloop_server.state.records.campaign import Campaign

# -- create -------------------------------------------------------------------------------------


# a repo git reaches over the network; anything else (a path, file://) is read from the server's own disk
NETWORK_REPO = re.compile(r"^(?:https?|ssh|git)://|^[\w.-]+@[\w.-]+:")


def host_paths(req: CampaignCreate) -> list[str]:
    """The flags of `req` that have the server read its own host's files: a repo path (or file://), a workspace."""
    out = [] if NETWORK_REPO.match(req.repo) else [f"--repo {req.repo}"]
    return out + ([f"--workspace {req.workspace}"] if req.workspace is not None else [])


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
    rt.retention.release_campaign(name)  # its ended jobs that retention kept for it go the next pass
    shutil.rmtree(repo_dir(rt, name).parent, ignore_errors=True)
    rt.events.add("campaign.removed", by, campaign=name, cancelled=",".join(cancelled))
    return cancelled
