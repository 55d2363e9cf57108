"""The generation marker: how the daemon tells that Redis lost its data under it.

Redis holds `generation`; the daemon keeps its own record of it in `$PILOOP_HOME`. A Redis
that comes back empty, or from a stale replica, shows a generation lower than the record (or
none): the daemon then moves to a generation above both, so tokens (which start with the
generation) never go backwards, and holds all claims until workers have re-announced.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import redis

from piloop_server.state.keys import Keys
from piloop_server.state.records.codec import text as _s


@dataclass(frozen=True)
class GenerationCheck:
    generation: int
    lost_data: bool  # Redis forgot what the record says it held


class GenerationRecord:
    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self, namespace: str) -> int:
        try:
            return int(json.loads(self.path.read_text()).get(namespace, 0))
        except (FileNotFoundError, ValueError):
            return 0

    def read_replid(self, namespace: str) -> str:
        """The replication id of the primary the daemon last watched ("" before one), so that a daemon started after
        a failover still sees it (state.failover)."""
        try:
            return str(json.loads(self.path.read_text()).get(f"{namespace} replid", ""))
        except (FileNotFoundError, ValueError):
            return ""

    def write_replid(self, namespace: str, replid: str) -> None:
        self._put(f"{namespace} replid", replid)

    def write(self, namespace: str, generation: int) -> None:
        self._put(namespace, generation)

    def _put(self, key: str, value: int | str) -> None:
        try:
            data = json.loads(self.path.read_text())
        except (FileNotFoundError, ValueError):
            data = {}
        data[key] = value
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, self.path)


def ensure_generation(client: redis.Redis, keys: Keys, record: GenerationRecord, hold_ms: int) -> GenerationCheck:
    """Check the marker against the record; after a data loss move on and hold claims for `hold_ms`."""
    seen = record.read(keys.namespace)
    raw = client.get(keys.generation())
    current = int(raw) if raw is not None else 0
    if current and current >= seen:
        if current != seen:
            record.write(keys.namespace, current)
        return GenerationCheck(current, False)
    if not seen and not current:
        # a first start: nothing was ever there to lose
        client.set(keys.generation(), 1, nx=True)
        gen = int(client.get(keys.generation()) or 1)
        record.write(keys.namespace, gen)
        return GenerationCheck(gen, False)
    gen = max(seen, current) + 1
    pipe = client.pipeline(transaction=True)
    pipe.set(keys.generation(), gen)
    t = client.time()
    now_ms = t[0] * 1000 + t[1] // 1000
    pipe.hset(keys.daemon(), mapping={"hold_until": now_ms + hold_ms, "lost_data_at": now_ms})
    pipe.execute()
    record.write(keys.namespace, gen)
    return GenerationCheck(gen, True)


def current_generation(client: redis.Redis, keys: Keys) -> int | None:
    """The generation Redis holds now (None before the daemon's first start)."""
    raw = client.get(keys.generation())
    return int(raw) if raw is not None else None


def keep_server_id(client: redis.Redis, keys: Keys, candidate: str) -> str:
    """The server's id as Redis keeps it: `candidate` on a first start, the stored one ever after (it tags the
    workers the server starts, so a restarted daemon knows its own)."""
    client.hsetnx(keys.daemon(), "server_id", candidate)
    return _s(client.hget(keys.daemon(), "server_id")) or candidate


def stored_server_id(client: redis.Redis, keys: Keys) -> str:
    """The id a running server keeps ("" before one has started)."""
    return _s(client.hget(keys.daemon(), "server_id"))
