"""The producers' calls of the lease engine: a job queued (one, or many in one round trip) and a campaign's agent
launched. A part of `LeasesState` (state/leases.py)."""

from __future__ import annotations

import json
from typing import Any

from piloop_common.errors import PiloopError
from piloop_server.state.keys import Keys
from piloop_server.state.scripts import Scripts


class Producers:
    k: Keys
    scripts: Scripts

    def enqueue(
        self,
        job_id: str,
        kind: str,
        pool: str,
        spec: dict[str, Any],
        *,
        by: str,
        campaign: str = "",
        image: str = "",
        now_ms: int | None = None,
    ) -> int:
        """Queue a new job; when it was queued (ms). `now_ms` sets that time (tests order jobs with it), else
        Redis's clock does."""
        keys = self._enqueue_keys(job_id, kind, pool)
        when = "" if now_ms is None else str(now_ms)
        return int(self.scripts.run("enqueue", keys, [job_id, kind, pool, campaign, image, json.dumps(spec), by, when]))

    def _enqueue_keys(self, job_id: str, kind: str, pool: str) -> list[str]:
        k = self.k
        return [k.job(job_id), k.queue(pool, kind), k.jobs(), k.events(), k.delayed(), k.expiring()]

    def enqueue_many(
        self, jobs: list[tuple[str, dict[str, Any]]], kind: str, pool: str, *, by: str
    ) -> list[int | PiloopError]:
        """`enqueue` of each (job id, spec) in one round trip (the queue-depth bench fills deep queues with it)."""
        calls: list[tuple[list[str], list[Any]]] = [
            (self._enqueue_keys(j, kind, pool), [j, kind, pool, "", "", json.dumps(spec), by, ""]) for j, spec in jobs
        ]
        return [r if isinstance(r, PiloopError) else int(r) for r in self.scripts.run_many("enqueue", calls)]

    def launch(
        self, campaign: str, job_id: str, pool: str, spec: dict[str, Any] | None, *, by: str
    ) -> tuple[int, bool]:
        """Forget a campaign's ended agents; with a spec, queue one more while it is under its target."""
        k = self.k
        reply = self.scripts.run(
            "launch",
            [
                k.campaign(campaign),
                k.campaign_agents(campaign),
                k.campaign_runs(campaign),
                k.job(job_id),
                k.queue(pool, "agent"),
                k.jobs(),
                k.events(),
                k.delayed(),
                k.expiring(),
            ],
            [k.prefix(), job_id, pool, campaign, json.dumps(spec or {}), by, 1 if spec is not None else 0],
        )
        return int(reply[0]), bool(int(reply[1]))
