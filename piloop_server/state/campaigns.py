"""The campaigns in Redis: each one's record, its agents, runs and scores, the runs waiting to be taken in, and
the cache of bundles built for workers (the git and CAS work is in piloop_server/campaigns.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import redis

from piloop_server.state.connection import Client
from piloop_server.state.keys import Keys
from piloop_server.state.records.campaign import Campaign
from piloop_server.state.records.codec import fields
from piloop_server.state.records.codec import text as _s

FOLD_TRIES = 20  # runs of one campaign may end together: each fold is tried again over the latest manifest


class CampaignsState:
    def __init__(self, client: Client, keys: Keys) -> None:
        self.r = client
        self.k = keys

    # -- the record ----------------------------------------------------------------------------
    def names(self) -> list[str]:
        return sorted(_s(n) for n in self.r.smembers(self.k.campaign_names()))

    def exists(self, name: str) -> bool:
        return bool(self.r.sismember(self.k.campaign_names(), name))

    def reserve(self, name: str) -> bool:
        """Take the name for a campaign being made; False when another has it."""
        return bool(self.r.sadd(self.k.campaign_names(), name))

    def get(self, name: str) -> Campaign | None:
        return Campaign.from_hash(self.r.hgetall(self.k.campaign(name)))

    def put(self, rec: Campaign) -> None:
        self.r.hset(self.k.campaign(rec.name), mapping=fields(rec.to_hash()))

    def set_state(self, name: str, state: str) -> None:
        self.r.hset(self.k.campaign(name), "state", state)

    def fold_workspace(self, name: str, fold: Callable[[str], tuple[str, int]]) -> bool:
        """Replace the workspace manifest's address by `fold(old address)` -> (new address, files) under WATCH;
        False when it kept changing meanwhile."""
        key = self.k.campaign(name)
        for _ in range(FOLD_TRIES):
            with self.r.pipeline() as pipe:
                try:
                    pipe.watch(key)
                    new, files = fold(_s(pipe.hget(key, "workspace")))
                    pipe.multi()
                    pipe.hset(key, mapping={"workspace": new, "workspace_files": files})
                    pipe.execute()
                    return True
                except redis.WatchError:
                    continue
        return False

    def forget(self, name: str) -> None:
        """The campaign's keys, all at once; its jobs stay."""
        k = self.k
        pipe = self.r.pipeline()
        pipe.srem(k.campaign_names(), name)
        pipe.delete(k.campaign(name), k.campaign_agents(name), k.campaign_runs(name), k.campaign_scores(name))
        pipe.hdel(k.campaign_live(), name)
        pipe.execute()

    # -- agents, runs and scores ---------------------------------------------------------------
    def agents(self, name: str) -> list[str]:
        """Its agents' jobs not yet ended (queued, leased, running): what counts toward its target."""
        return sorted(_s(j) for j in self.r.smembers(self.k.campaign_agents(name)))

    def runs(self, name: str) -> list[str]:
        """Its runs, oldest first."""
        return [_s(j) for j in self.r.zrange(self.k.campaign_runs(name), 0, -1)]

    def run_count(self, name: str) -> int:
        return int(self.r.zcard(self.k.campaign_runs(name)))

    def newest_run_ms(self, name: str) -> float:
        """When its newest run was launched (ms), 0 for none."""
        newest = self.r.zrevrange(self.k.campaign_runs(name), 0, 0, withscores=True)
        return float(newest[0][1]) if newest else 0.0

    def scores(self, name: str) -> dict[str, float]:
        rows: Any = self.r.zrange(self.k.campaign_scores(name), 0, -1, withscores=True)  # [(member, score)]
        return {_s(r): float(s) for r, s in rows}

    def best(self, name: str, n: int) -> list[tuple[str, float]]:
        """Its `n` best-scored runs, best first."""
        rows: Any = self.r.zrevrange(self.k.campaign_scores(name), 0, n - 1, withscores=True)
        return [(_s(r), float(s)) for r, s in rows]

    def score(self, name: str, run: str, score: float) -> None:
        self.r.zadd(self.k.campaign_scores(name), {run: score})

    # -- runs waiting to be taken in ------------------------------------------------------------
    def pending(self, most: int) -> list[str]:
        """Up to `most` ended campaign jobs not yet taken in (report.lua adds them)."""
        return [_s(j) for j in self.r.srandmember(self.k.campaign_pending(), most) or []]

    def taken_in(self, job_id: str) -> None:
        self.r.srem(self.k.campaign_pending(), job_id)

    # -- bundles built for workers, by what they leave out ----------------------------------------
    def cached_bundle(self, name: str, have: str) -> str | None:
        got = self.r.get(self.k.campaign_bundle(name, have))
        return _s(got) if got is not None else None

    def cache_bundle(self, name: str, have: str, value: str, seconds: int) -> None:
        self.r.set(self.k.campaign_bundle(name, have), value, ex=seconds)
