"""Retention in Redis: ended jobs removed past their horizon (`scripts/prune.lua`), events past their age.

Every way a job ends goes through `include/finish.lua`, which indexes it in `ended` by when it ended, so the prune
reads only what is due: one bounded batch a call, oldest first. docs/operations.md ("Retention") has the rules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis

from piloop_server.state.keys import Keys
from piloop_server.state.records.codec import text as _s
from piloop_server.state.records.job import FIELDS as JF
from piloop_server.state.scripts import Fence, Scripts

FINISHED = ("succeeded", "cancelled", "expired")  # expired: what its submitter asked for, like a cancel
FAILED = ("failed", "lost", "worker_lost")
PRUNE_BATCH = 500
MEMORY_ALARM_FIELD = "memory_alarm"  # in the daemon hash: '1' while used memory is past the alarm's share


@dataclass(frozen=True)
class Horizons:
    """How long each ended state is kept (ms; None: forever), from `[plugins.retention]`."""

    finished_ms: int | None
    failed_ms: int | None

    @classmethod
    def of(cls, cfg: Any) -> Horizons:
        def ms(seconds: float) -> int | None:
            return int(seconds * 1000) if seconds > 0 else None

        return cls(ms(cfg.finished_seconds), ms(cfg.failed_seconds))

    def split(self) -> tuple[int, tuple[str, ...], int] | None:
        """(the shorter horizon, the states it applies to, the longer one or -1 for forever), or None when every
        ended job is kept forever."""
        classes = [(self.finished_ms, FINISHED), (self.failed_ms, FAILED)]
        finite = sorted((h, states) for h, states in classes if h is not None)
        if not finite:
            return None
        short, states = finite[0]
        rest = [h for h, s in classes if s != states]
        longer = rest[0] if rest else short
        if longer is not None and longer == short:  # one horizon for all
            return short, FINISHED + FAILED, -1
        return short, states, -1 if longer is None else longer


@dataclass(frozen=True)
class Memory:
    """Redis's memory as INFO says it: what it holds, and its `maxmemory` (0: no limit set)."""

    used: int
    maxmemory: int

    @property
    def share(self) -> float | None:
        return self.used / self.maxmemory if self.maxmemory else None


@dataclass(frozen=True)
class Pruned:
    removed: int  # jobs removed from Redis
    for_campaign: int  # past their horizon, kept because their campaign exists
    moved: int  # of the longer-kept states, moved to wait for the longer horizon


class RetentionState:
    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.r = client
        self.k = keys
        self.scripts = Scripts(client)

    def prune(self, horizons: Horizons, batch: int = PRUNE_BATCH, fence: Fence | None = None) -> Pruned:
        """One batch of ended jobs past their horizon (each index read at most `batch` deep)."""
        split = horizons.split()
        if split is None:
            return Pruned(0, 0, 0)
        short, states, longer = split
        k = self.k
        reply = self.scripts.run(
            "prune", [k.ended(), k.ended_kept(), k.jobs()], [k.prefix(), short, " ".join(states), longer, batch], fence
        )
        return Pruned(int(reply[0]), int(reply[1]), int(reply[2]))

    def release_campaign(self, name: str) -> int:
        """Hand a removed campaign's kept jobs back to the prune, by when each ended; how many."""
        k = self.k
        ids = [_s(j) for j in self.r.smembers(k.campaign_kept(name))]
        pipe = self.r.pipeline(transaction=False)
        for j in ids:
            pipe.hget(k.job(j), JF["ended"])
        when = pipe.execute() if ids else []
        pipe = self.r.pipeline(transaction=True)
        if ids:
            pipe.zadd(k.ended(), {j: int(_s(w) or 0) for j, w in zip(ids, when, strict=True)})
        pipe.delete(k.campaign_kept(name))
        pipe.execute()
        return len(ids)

    def retained(self) -> int:
        """Ended jobs Redis still holds that the prune will remove in time (a campaign's kept ones aside)."""
        return int(self.r.zcard(self.k.ended())) + int(self.r.zcard(self.k.ended_kept()))

    def memory(self) -> Memory:
        info: dict[str, Any] = self.r.info("memory")
        return Memory(int(info.get("used_memory", 0)), int(info.get("maxmemory", 0)))

    def memory_alarm(self, on: bool) -> bool:
        """Record whether used memory is past the alarm's share; True when that changed (one escalation per rise,
        kept in Redis so that a restarted daemon does not raise it again)."""
        if on:
            return bool(self.r.hsetnx(self.k.daemon(), MEMORY_ALARM_FIELD, 1))
        return bool(self.r.hdel(self.k.daemon(), MEMORY_ALARM_FIELD))

    def trim_events(self, older_than_ms: int) -> int:
        """Drop the events older than `older_than_ms` (Redis's clock); how many went."""
        now_s, now_us = self.r.time()
        cutoff = int(now_s) * 1000 + int(now_us) // 1000 - older_than_ms
        return int(self.r.xtrim(self.k.events(), minid=f"{max(0, cutoff)}-0", approximate=False))
