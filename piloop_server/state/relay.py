"""Typed wrappers around the relay scripts: a job's own calls, each checked against its lease in the same script."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import redis

from piloop_common.errors import Forbidden
from piloop_server.state.keys import Keys
from piloop_server.state.records.codec import text as _s
from piloop_server.state.scripts import Scripts

RELAYED_EVALUATIONS = 100  # the most evaluations one agent may queue through its relay
_FORBIDDEN = "PILOOP_FORBIDDEN "


@dataclass(frozen=True)
class RelayCaller:
    """Who relays: the job, the token of its lease, and the worker that holds it."""

    job: str
    token: str
    worker: str
    owner: str = ""  # the identity of the token that calls (api/worker_door.owner); '' leaves it unchecked

    @property
    def signed(self) -> str:
        return f"worker:{self.worker}/job:{self.job}"


@dataclass(frozen=True)
class LiveJob:
    kind: str
    campaign: str
    pool: str
    spec: dict[str, Any]


class RelayState:
    def __init__(self, client: redis.Redis, keys: Keys, progress_keep: int) -> None:
        self.k = keys
        self.progress_keep = progress_keep
        self.scripts = Scripts(client)

    def _keys(self, c: RelayCaller) -> list[str]:
        return [self.k.lease(c.job), self.k.job(c.job), self.k.events()]

    def _args(self, c: RelayCaller) -> list[Any]:
        return [c.job, c.token, c.worker]

    def check(self, c: RelayCaller) -> LiveJob:
        """The caller's job, while its lease is live under its token (else `LeaseLost`)."""
        reply = self.scripts.run("relay_check", self._keys(c), [*self._args(c), c.owner])
        kind, campaign, pool, spec = (_s(x) for x in reply)
        return LiveJob(kind, campaign, pool, json.loads(spec))

    def progress(self, c: RelayCaller, note: str) -> int:
        return int(
            self.scripts.run(
                "relay_progress",
                [*self._keys(c), self.k.job_progress(c.job)],
                [*self._args(c), json.dumps({"note": note, "by": c.signed}), self.progress_keep, c.owner],
            )
        )

    def submit_evaluation(self, c: RelayCaller, job_id: str, pool: str, spec: dict[str, Any], *, campaign: str) -> bool:
        """Queue `campaign`'s evaluation `job_id` (its spec built by the server) for the agent `c`, checked against
        the agent's lease and kind in the same script. True when queued now; False when this agent had queued it."""
        k = self.k
        try:
            reply = self.scripts.run(
                "relay_submit",
                [*self._keys(c), k.job(job_id), k.queue(pool, "evaluation"), k.jobs(), k.delayed(), k.expiring()],
                [*self._args(c), job_id, pool, campaign, json.dumps(spec), c.signed, RELAYED_EVALUATIONS, c.owner],
            )
        except redis.exceptions.ResponseError as e:
            if str(e).startswith(_FORBIDDEN):
                raise Forbidden(str(e).removeprefix(_FORBIDDEN)) from e
            raise
        return bool(int(reply[1]))
