"""The workers' records in Redis, as the operator's views and the claim route read them (the writes that must be
atomic with a lease are in the scripts: register, heartbeat, claim, drain)."""

from __future__ import annotations

from piloop_server.state.connection import Client
from piloop_server.state.keys import Keys
from piloop_server.state.records.codec import text as _s
from piloop_server.state.records.worker import FIELDS, WorkerRecord

KINDS = ("agent", "evaluation")


class WorkersState:
    def __init__(self, client: Client, keys: Keys) -> None:
        self.r = client
        self.k = keys

    def now_ms(self) -> int:
        """Redis's clock, which the scripts stamp `seen` with."""
        sec, usec = self.r.time()
        return int(sec) * 1000 + int(usec) // 1000

    def names(self) -> list[str]:
        return sorted(_s(n) for n in self.r.smembers(self.k.workers()))

    def get(self, name: str) -> WorkerRecord | None:
        """One worker's hash (no alive key, no leases: what a claim reads)."""
        return WorkerRecord.from_hash(self.r.hgetall(self.k.worker(name)))

    def all(self) -> list[WorkerRecord]:
        """Every registered worker with its alive key and its leases, by name, in one round trip."""
        names = self.names()
        pipe = self.r.pipeline(transaction=False)
        for n in names:
            pipe.hgetall(self.k.worker(n))
            pipe.exists(self.k.worker_alive(n))
            for kind in KINDS:
                pipe.smembers(self.k.worker_leases(n, kind))
        got = pipe.execute()
        step = 2 + len(KINDS)
        out = []
        for i, _ in enumerate(names):
            h, alive, *held = got[step * i : step * i + step]
            rec = WorkerRecord.from_hash(
                h, bool(alive), {kind: sorted(_s(j) for j in ids) for kind, ids in zip(KINDS, held, strict=True)}
            )
            if rec is not None:
                out.append(rec)
        return out

    def set_reason(self, name: str, reason: str) -> None:
        self.r.hset(self.k.worker(name), FIELDS["reason"], reason)
