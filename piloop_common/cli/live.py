"""`piloop status`'s running agents: the last lines each wrote, and how to follow it (`piloop attach`)."""

from __future__ import annotations

from typing import Any

from piloop_common.errors import PiloopError
from piloop_common.sdk.client import part

MOST_AGENTS = 5  # status is a summary: `piloop job list --state running` lists them all
TAIL_LINES = 3
LINE_WIDTH = 120


def running_agents(api: Any) -> list[dict[str, Any]]:
    rows = api.call("GET", "/v1/jobs", params={"state": "running", "limit": 200})
    return [j for j in rows if j["kind"] == "agent"]


def tail(api: Any, job: dict[str, Any]) -> list[str]:
    """The last lines of the job's last uploaded log chunk (the worker uploads a few seconds after it writes)."""
    if not job["log"]:
        return []
    data = api.call_bytes("GET", f"/v1/jobs/{part(job['id'])}/log/{len(job['log']) - 1}").content
    lines = [ln for ln in data.decode("utf-8", errors="replace").splitlines() if ln.strip()]
    return [ln[:LINE_WIDTH] for ln in lines[-TAIL_LINES:]]


def agent_lines(api: Any) -> list[str]:
    """The status section: each running agent, its campaign and worker, its last lines, the attach command."""
    agents = running_agents(api)
    if not agents:
        return []
    out = [f"agents running ({len(agents)}): the last lines each wrote; `piloop attach JOB` follows one"]
    for j in agents[:MOST_AGENTS]:
        where = f"campaign {j['campaign']}, " if j["campaign"] else ""
        out.append(f"  {j['id']}  {where}on {j['worker'] or '-'}")
        try:
            out += [f"    | {ln}" for ln in tail(api, j)] or ["    (no output uploaded yet)"]
        except PiloopError as e:  # a chunk gone from the CAS must not cost the rest of status
            out.append(f"    (its log is not readable: {e.message})")
    if len(agents) > MOST_AGENTS:
        out.append(f"  … and {len(agents) - MOST_AGENTS} more: `piloop job list --state running`")
    return out
