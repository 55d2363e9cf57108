"""`piloop campaign`: create, list, show, pause, resume, rm, wait."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import click

from piloop_common.cli.output import WaitNote, emit_json, parse_env, progress_done, table, when
from piloop_common.duration import parse_duration
from piloop_common.sdk.client import part


@click.group()
def campaign() -> None:
    """Campaigns: a repo, a workspace, agents that change it and an evaluation that scores each run."""


def _score(v: float | None) -> str:
    return "-" if v is None else f"{v:g}"


@campaign.command("create")
@click.argument("name")
@click.option("--repo", required=True, metavar="PATH_OR_URL", help="A git repo the server's host can clone.")
@click.option("--agent-cmd", required=True, help="The agent's command (run by sh in its clone).")
@click.option("--eval-cmd", required=True, help="Prints the score: `score=<number>` (or JSON) as its last line.")
@click.option("--agents", default=1, show_default=True, type=click.IntRange(0, 1000), help="Agents kept live.")
@click.option("--agent-pool", default="serve", show_default=True, help="The pool its agents run on.")
@click.option("--eval-pool", default="serve", show_default=True, help="The pool its evaluations run on.")
@click.option("--workspace", metavar="DIR", help="The shared workspace's first copy.")
@click.option("--agent-timeout", metavar="DURATION", help="Stop an agent after this long, like 2h.")
@click.option("--eval-timeout", metavar="DURATION", help="Stop an evaluation after this long.")
@click.option("--agent-memory", metavar="SIZE", help="Each agent's memory grant, like 8G (default: the pool's).")
@click.option("--eval-memory", metavar="SIZE", help="Each evaluation's memory grant (default: the pool's).")
@click.option(
    "--eval-max-attempts",
    type=click.IntRange(1, 100),
    default=1,
    show_default=True,
    help="Attempts an evaluation may fail before it ends failed.",
)
@click.option("--secret", "secrets", multiple=True, metavar="NAME", help="A secret the agents get as env.")
@click.option("--env", "envs", multiple=True, metavar="K=V", help="Env for the agents.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def create(
    obj,
    name,
    repo,
    agent_cmd,
    eval_cmd,
    agents,
    agent_pool,
    eval_pool,
    workspace,
    agent_timeout,
    eval_timeout,
    agent_memory,
    eval_memory,
    eval_max_attempts,
    secrets,
    envs,
    as_json,
) -> None:
    """Create a campaign: the server clones the repo and bundles it once; its agents start at once."""
    from piloop_common.sizes import parse_memory

    env = parse_env(envs)
    local = not obj.remote  # from afar a path is the server's to judge: it refuses one on its host
    if local and "://" not in repo and not repo.startswith("git@"):
        if not Path(repo).exists():
            raise click.UsageError(f"--repo {repo}: no such path")
        repo = str(Path(repo).absolute())  # the server's cwd is not ours
    if workspace is not None and local:
        if not Path(workspace).is_dir():
            raise click.UsageError(f"--workspace {workspace}: not a directory")
        workspace = str(Path(workspace).absolute())
    body = {
        "name": name,
        "repo": repo,
        "agent_cmd": agent_cmd,
        "eval_cmd": eval_cmd,
        "agents": agents,
        "agent_pool": agent_pool,
        "eval_pool": eval_pool,
        "workspace": workspace,
        "secrets": list(secrets),
        "env": env,
        "agent_timeout_seconds": parse_duration(agent_timeout, "--agent-timeout") if agent_timeout else None,
        "eval_timeout_seconds": parse_duration(eval_timeout, "--eval-timeout") if eval_timeout else None,
        "agent_memory_mb": parse_memory(agent_memory, "--agent-memory") if agent_memory else None,
        "eval_memory_mb": parse_memory(eval_memory, "--eval-memory") if eval_memory else None,
        "eval_max_attempts": eval_max_attempts,
    }
    with obj.api(timeout=600) as api:
        c = api.call("POST", "/v1/campaigns", body)
    if as_json:
        emit_json(c)
        return
    click.echo(
        f"campaign {c['name']}: {c['agents']} agent(s) on pool {c['agent_pool']}, evaluations on "
        f"{c['eval_pool']}; repo at {c['base'][:12]}, bundle {c['bundle_bytes']} bytes in the CAS, "
        f"{c['workspace_files']} workspace file(s)"
    )


@campaign.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def listing(obj, as_json) -> None:
    """Every campaign: its state, live agents, runs and best score."""
    with obj.api() as api:
        rows = api.call("GET", "/v1/campaigns")
    if as_json:
        emit_json(rows)
        return
    click.echo(
        table(
            ["campaign", "state", "agents", "queued", "target", "pool", "best", "created"],
            [
                [
                    c["name"],
                    c["state"],
                    c["live"],
                    c["queued"],
                    c["agents"],
                    c["agent_pool"],
                    _score(c["best"]),
                    when(c["created_ms"]),
                ]
                for c in rows
            ],
        )
    )


@campaign.command("show")
@click.argument("name")
@click.option("--runs", "max_runs", default=20, show_default=True, help="How many runs to list (best first).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def show(obj, name, max_runs, as_json) -> None:
    """A campaign, its live agents, and its runs ranked by score."""
    with obj.api() as api:
        c = api.call("GET", f"/v1/campaigns/{part(name)}")
    if as_json:
        emit_json(c)
        return
    lines = [
        ("campaign", c["name"]),
        ("state", c["state"]),
        ("repo", c["repo"]),
        ("base", c["base"]),
        ("agents", f"{c['live']} live, {c['queued']} queued, target {c['agents']} on pool {c['agent_pool']}"),
        ("evaluations", f"on pool {c['eval_pool']}"),
        ("agent command", c["agent_cmd"]),
        ("eval command", c["eval_cmd"]),
        ("workspace", f"{c['workspace_files']} file(s), {c['workspace']}"),
        ("runs", f"{len(c['runs'])}, best score {_score(c['best'])}"),
    ]
    width = max(len(k) for k, _ in lines)
    for k, v in lines:
        click.echo(f"{k.ljust(width)}  {v}")
    if c["runs"]:
        click.echo("")
        click.echo(
            table(
                ["rank", "run", "state", "worker", "head", "evaluation", "score", "reason"],
                [
                    [
                        i + 1 if r["score"] is not None else "-",
                        r["branch"],
                        r["state"],
                        r["worker"] or "-",
                        r["head"][:12] or "-",
                        r["evaluation_state"] or "-",
                        _score(r["score"]),
                        r["reason"][:50] or "-",
                    ]
                    for i, r in enumerate(c["runs"][:max_runs])
                ],
            )
        )


def _post(obj, name: str, what: str) -> dict[str, Any]:
    with obj.api() as api:
        return api.call("POST", f"/v1/campaigns/{part(name)}/{what}")


@campaign.command("pause")
@click.argument("name")
@click.pass_obj
def pause(obj, name) -> None:
    """Launch no new agent and withdraw the queued ones; the live ones run to their end."""
    c = _post(obj, name, "pause")
    click.echo(f"campaign {name}: paused ({c['live']} agent(s) still live)")


@campaign.command("resume")
@click.argument("name")
@click.pass_obj
def resume(obj, name) -> None:
    """Launch agents again after `campaign pause`."""
    _post(obj, name, "resume")
    click.echo(f"campaign {name}: active")


@campaign.command("rm")
@click.argument("name")
@click.option("--force", is_flag=True, help="Cancel its agents that have not ended.")
@click.pass_obj
def rm(obj, name, force) -> None:
    """Forget a campaign (also `delete`): its jobs stay listed until retention removes them ([plugins.retention]),
    its blobs stay in the CAS."""
    with obj.api() as api:
        got = api.call("DELETE", f"/v1/campaigns/{part(name)}", params={"force": "true"} if force else None)
    n = len(got["cancelled"])
    click.echo(f"campaign {name}: removed" + (f", {n} agent(s) cancelled" if n else ""))


campaign.add_command(rm, "delete")


def _waiting(api: Any, c: dict[str, Any]) -> str:
    """Why the campaign's queued agents and evaluations have no lease, from `/v1/status`'s pools; '' when none waits."""
    pools = {p["pool"]: p.get("waiting") or {} for p in api.call("GET", "/v1/status")["pools"]}
    why = [pools.get(c["agent_pool"], {}).get("agent", ""), pools.get(c["eval_pool"], {}).get("evaluation", "")]
    return "; ".join(dict.fromkeys(w for w in why if w))


@campaign.command("wait")
@click.argument("name")
@click.option("--runs", "want", default=1, show_default=True, type=click.IntRange(1), help="Scored runs to wait for.")
@click.option("--timeout", metavar="DURATION", help="Give up after this long (exit 124).")
@click.pass_obj
def wait(obj, name, want, timeout) -> None:
    """Wait until the campaign has this many scored runs, then print them ranked."""
    limit = parse_duration(timeout, "--timeout") if timeout else None
    started = time.monotonic()
    note, why, asked = WaitNote(), "", 0.0
    with obj.api() as api:
        while True:
            c = api.call("GET", f"/v1/campaigns/{part(name)}")
            scored = [r for r in c["runs"] if r["score"] is not None]
            if len(scored) >= want:
                break
            waited = time.monotonic() - started
            if limit is not None and waited > limit:
                progress_done()
                click.echo(f"piloop: gave up after {limit:g}s with {len(scored)} of {want} scored run(s)", err=True)
                sys.exit(124)
            if time.monotonic() - asked > 2:  # why its jobs wait, where its pools' workers tell (`piloop status`)
                why, asked = _waiting(api, c), time.monotonic()
            note.show(
                f"waiting {waited:.0f}s: {len(scored)}/{want} scored, {c['live']} agent(s) live, "
                f"{len(c['runs'])} run(s)",
                why,
            )
            time.sleep(0.5)
    progress_done()
    click.echo(
        table(
            ["rank", "run", "head", "score"],
            [[i + 1, r["branch"], r["head"][:12], _score(r["score"])] for i, r in enumerate(scored)],
        )
    )
