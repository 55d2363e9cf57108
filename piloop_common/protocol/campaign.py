"""The messages of campaigns: creating one, reading its runs, and a worker fetching what is newer in its repo."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from piloop_common.protocol.worker import Message

CAMPAIGN_NAME = r"^[a-z0-9][a-z0-9_-]{0,62}$"


class CampaignCreate(Message):
    name: str = Field(pattern=CAMPAIGN_NAME)
    repo: str = Field(min_length=1, description="A git repo: a path on the server's host or a URL git can clone.")
    agent_cmd: str = Field(min_length=1)
    eval_cmd: str = Field(min_length=1)
    agents: int = Field(1, ge=0, le=1000)
    agent_pool: str = "serve"
    eval_pool: str = "serve"
    workspace: str | None = Field(
        None, description="A directory on the server's host: the shared workspace's first copy."
    )
    agent_timeout_seconds: float | None = Field(None, gt=0)
    eval_timeout_seconds: float | None = Field(None, gt=0)
    secrets: list[str] = Field(default_factory=list, description="Secrets the campaign's agents get.")
    env: dict[str, str] = Field(default_factory=dict)
    agent_memory_mb: int | None = Field(None, gt=0, description="Each agent's memory grant (else the pool's).")
    eval_memory_mb: int | None = Field(None, gt=0, description="Each evaluation's memory grant (else the pool's).")
    eval_max_attempts: int = Field(
        1, ge=1, le=100, description="Attempts an evaluation may fail before it ends failed."
    )


class RunView(Message):
    """One agent run of a campaign: its branch, its head, its evaluation and score."""

    job: str
    state: str
    branch: str
    worker: str = ""
    base: str = ""
    head: str = ""
    evaluation: str = ""
    evaluation_state: str = ""
    score: float | None = None
    reason: str = ""
    created_ms: int = 0


class CampaignView(Message):
    name: str
    state: Literal["active", "paused"]
    repo: str
    base: str
    bundle: str
    bundle_bytes: int = 0
    agent_cmd: str
    eval_cmd: str
    agents: int
    agent_pool: str
    eval_pool: str
    workspace: str = Field("", description="CAS address of the workspace manifest now.")
    workspace_files: int = 0
    live: int = Field(0, description="Agents leased or running now.")
    queued: int = Field(0, description="Agents launched and waiting for a lease.")
    created_ms: int = 0
    by: str = ""
    runs: list[RunView] = Field(default_factory=list, description="Every run, the scored ones first by score.")
    best: float | None = None


class BundleRequest(Message):
    """A worker asks for what is newer in a campaign's repo than the commits it holds."""

    protocol: int
    job: str
    token: str
    have: list[str] = Field(default_factory=list, max_length=1000)


class BundleResponse(Message):
    address: str | None = Field(None, description="CAS address of a bundle of what is newer; none when nothing is.")
    size: int = 0
