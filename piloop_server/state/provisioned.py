"""The provisioner's state in Redis: the workers the server started, each pool's start backoff, and what the pass
reads of the workers and queues to decide (typed; the policy is in piloop_server/provisioner/manager.py)."""

from __future__ import annotations

from dataclasses import dataclass

import redis

from piloop_server.state.keys import Keys
from piloop_server.state.records.codec import fields
from piloop_server.state.records.codec import text as _s
from piloop_server.state.records.provisioned import PoolBackoff, Provisioned
from piloop_server.state.records.worker import FIELDS as WF
from piloop_server.state.scripts import Scripts

KINDS = ("agent", "evaluation")
# the fields of a worker's hash that the provisioner reads (written by register.lua and drain.lua)


@dataclass(frozen=True)
class WorkerSeen:
    """What the pass reads of one worker: its pool, whether it registered, drains, is reachable, and its leases."""

    name: str
    pool: str
    registered: bool
    draining: bool
    alive: bool
    agents: int
    evaluations: int

    @property
    def leases(self) -> int:
        return self.agents + self.evaluations


class ProvisionedState:
    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.r = client
        self.k = keys
        self.scripts = Scripts(client)

    def now_ms(self) -> int:
        """Redis's clock, in ms: every deadline of the provisioner is on it."""
        sec, usec = self.r.time()
        return int(sec) * 1000 + int(usec) // 1000

    # -- started workers -----------------------------------------------------------------------
    def names(self) -> list[str]:
        return sorted(_s(n) for n in self.r.smembers(self.k.provisioned_names()))

    def records(self) -> dict[str, Provisioned]:
        """Every started worker's record, by name (one SMEMBERS when there is none)."""
        names = self.names()
        if not names:
            return {}
        pipe = self.r.pipeline(transaction=False)
        for n in names:
            pipe.hgetall(self.k.provisioned(n))
        return {n: Provisioned.from_redis(n, h) for n, h in zip(names, pipe.execute(), strict=True) if h}

    def get(self, name: str) -> Provisioned | None:
        h = self.r.hgetall(self.k.provisioned(name))
        return Provisioned.from_redis(name, h) if h else None

    def new_name(self, pool: str) -> str:
        """A name no started worker had: `<pool>-<n>`."""
        return f"{pool}-{self.r.incr(self.k.provisioned_seq())}"

    def create(self, rec: Provisioned) -> None:
        """Record a worker about to be started (its record and its name in one transaction)."""
        pipe = self.r.pipeline(transaction=True)
        pipe.hset(
            self.k.provisioned(rec.name),
            mapping=fields(
                Provisioned.encode(
                    pool=rec.pool, state=rec.state, since=rec.since, idle_since=rec.idle_since, why=rec.why
                )
            ),
        )
        pipe.sadd(self.k.provisioned_names(), rec.name)
        pipe.execute()

    def update(
        self,
        name: str,
        *,
        state: str | None = None,
        since: int | None = None,
        why: str | None = None,
        idle_since: int | None = None,
        handle: dict[str, str] | None = None,
        lost: bool | None = None,
        stop_tried: int | None = None,
    ) -> None:
        """Set the fields given (the others stay)."""
        given = {
            k: v
            for k, v in (
                ("state", state),
                ("since", since),
                ("why", why),
                ("idle_since", idle_since),
                ("handle", handle),
                ("lost", lost),
                ("stop_tried", stop_tried),
            )
            if v is not None
        }
        if given:
            self.r.hset(self.k.provisioned(name), mapping=fields(Provisioned.encode(**given)))

    def remove(self, name: str) -> None:
        """Forget a started worker's record (and its name) in one transaction."""
        pipe = self.r.pipeline(transaction=True)
        pipe.delete(self.k.provisioned(name))
        pipe.srem(self.k.provisioned_names(), name)
        pipe.execute()

    # -- a pool's start backoff ----------------------------------------------------------------
    def backoff(self, pool: str) -> PoolBackoff:
        return PoolBackoff.from_redis(self.r.hgetall(self.k.provisioner(pool)))

    def set_backoff(self, pool: str, *, delay: float, until: int, refusals: int, why: str) -> None:
        self.r.hset(
            self.k.provisioner(pool),
            mapping=fields(PoolBackoff.encode(delay=delay, until=until, refusals=refusals, why=why)),
        )

    def reset_backoff(self, pool: str) -> None:
        """A worker came up: the pool's backoff starts again from nothing."""
        self.r.delete(self.k.provisioner(pool))

    def halt(self, pool: str, why: str) -> None:
        self.r.hset(self.k.provisioner(pool), mapping=fields(PoolBackoff.encode(halted=why)))

    def unhalt(self, pool: str) -> None:
        """A restarted server tries the platform's credentials again."""
        self.r.hdel(self.k.provisioner(pool), *PoolBackoff.encode(halted="").keys())

    # -- what the pass reads of workers and queues ---------------------------------------------
    def workers(self, names: list[str] | None = None) -> dict[str, WorkerSeen]:
        """What the pass reads of `names` (default: every registered worker), in one round trip."""
        k = self.k
        if names is None:
            names = sorted(_s(n) for n in self.r.smembers(k.workers()))
        if not names:
            return {}
        pipe = self.r.pipeline(transaction=False)
        for n in names:
            pipe.hmget(k.worker(n), WF["pool"], WF["registered"], WF["draining"])
            pipe.exists(k.worker_alive(n))
            for kind in KINDS:
                pipe.scard(k.worker_leases(n, kind))
        got = pipe.execute()
        out = {}
        for i, n in enumerate(names):
            (pool, registered, draining), alive, agents, evals = got[4 * i : 4 * i + 4]
            out[n] = WorkerSeen(
                n, _s(pool), bool(registered), _s(draining) == "1", bool(alive), int(agents), int(evals)
            )
        return out

    def queued(self, pool: str) -> dict[str, int]:
        """The jobs waiting in a pool's queues, by kind."""
        pipe = self.r.pipeline(transaction=False)
        for kind in KINDS:
            pipe.zcard(self.k.queue(pool, kind))
        return dict(zip(KINDS, (int(n) for n in pipe.execute()), strict=True))

    # -- a worker's end ------------------------------------------------------------------------
    def drain(self, name: str, by: str, why: str) -> bool:
        """The worker takes no more jobs; whether it was known."""
        k = self.k
        return bool(self.scripts.run("drain", [k.worker(name), k.events()], [name, by, why]))

    def forget_worker(self, name: str, by: str) -> bool:
        """Drop an ended worker from the worker list, unless it still holds leases; whether it is gone."""
        k = self.k
        return bool(
            self.scripts.run(
                "forget_worker",
                [
                    k.worker(name),
                    k.worker_alive(name),
                    k.workers(),
                    k.worker_leases(name, "agent"),
                    k.worker_leases(name, "evaluation"),
                    k.events(),
                ],
                [name, by],
            )
        )
