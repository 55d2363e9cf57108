"""Capacity: a worker's slots per kind, why it got no lease, and why a pool's queued job waits.

A worker's "no lease" reason (`host_reason`, `combine_reasons`) is what `worker list` shows; `waiting` derives one
pool's reason from its workers' — the text `job show`, `job wait`, `status`, the page and the metrics give."""

from __future__ import annotations

from dataclasses import dataclass

from piloop_common.config.settings import PoolConfig
from piloop_common.protocol.operator import WorkerView
from piloop_common.protocol.worker import HostSample
from piloop_common.sizes import format_memory

# the reasons `waiting` gives, as the metrics label them (`piloop_queue_waiting{reason=…}`)
WAITING_CODES = ("no_worker", "unreachable", "draining", "image", "grant", "load", "memory", "slots")


def host_reason(pool: PoolConfig, sample: HostSample | None, admission: str = "") -> str:
    """Why this host takes no job now ('' when it may): load, memory, or the worker's own admission."""
    if sample is None:
        return ""
    if pool.max_load is not None and sample.load_per_cpu > pool.max_load:
        return "load"
    if sample.memory_available_gb < pool.min_memory_gb:
        return "memory"
    if admission:
        return admission
    return ""


def slots(pool: PoolConfig, kind: str) -> int:
    return pool.agents if kind == "agent" else pool.evaluations


def combine_reasons(per_kind: dict[str, str]) -> str:
    """One 'no lease' reason for a worker: a kind with free slots explains best; else slots are full."""
    free = [r for r in per_kind.values() if r != "slots"]
    return free[0] if free else "slots"


@dataclass(frozen=True)
class Waiting:
    """Why a pool's queued job of one kind has no lease: `code` (one of WAITING_CODES) and a sentence."""

    code: str
    text: str


@dataclass(frozen=True)
class PoolFacts:
    """What `waiting` reads besides the workers: the pool's config (limits applied), the limits that set its keys
    (key -> reason), and the executor's memory-pressure maximum."""

    name: str
    config: PoolConfig
    limits: dict[str, str]
    memory_pressure_max: float


def _limited(facts: PoolFacts, key: str) -> str:
    """' (a limit: REASON)' when a limit sets the pool's `key`, else ''."""
    why = facts.limits.get(f"executor.pools.{facts.name}.{key}")
    return f" (a limit: {why})" if why is not None else ""


def worker_waiting(facts: PoolFacts, w: WorkerView, kind: str) -> Waiting | None:
    """Why worker `w` takes no `kind` job now, from its "no lease" reason and latest sample; None when it may."""
    pool, name = facts.config, w.name
    if not w.reachable:
        return Waiting("unreachable", f"worker {name} is unreachable")
    if w.draining:
        return Waiting("draining", f"worker {name} is draining")
    s = w.sample
    host = host_reason(pool, s)
    if s is not None and host == "load":
        return Waiting(
            "load",
            f"worker {name}'s load {s.load1:.1f}/{s.cpus} ({s.load_per_cpu:.1f} per CPU) is over max_load "
            f"{pool.max_load:g}{_limited(facts, 'max_load')}",
        )
    if s is not None and host == "memory":
        return Waiting(
            "memory",
            f"worker {name}'s free memory {s.memory_available_gb:.1f} GB is under min_memory_gb "
            f"{pool.min_memory_gb:g}{_limited(facts, 'min_memory_gb')}",
        )
    if s is not None and s.memory_pressure is not None and s.memory_pressure > facts.memory_pressure_max:
        return Waiting(
            "memory",
            f"worker {name}'s memory pressure {s.memory_pressure:.0f}% is over memory_pressure_max "
            f"{facts.memory_pressure_max:g}%",
        )
    n, used = slots(pool, kind), (w.agents if kind == "agent" else w.evaluations)
    if used >= n:
        plural = "s are" if n != 1 else " is"
        return Waiting("slots", f"worker {name}'s {n} {kind} slot{plural} full")
    return None


def waiting(
    facts: PoolFacts, kind: str, workers: list[WorkerView], image: str = "", grant_mb: int = 0
) -> Waiting | None:
    """Why a queued `kind` job of the pool (with `image` and a grant of `grant_mb`) has no lease, where its workers
    tell; None when one of them may take it at its next claim, or a provisioner starts one for it."""
    pool, name = facts.config, facts.name
    key = "agents" if kind == "agent" else "evaluations"
    if slots(pool, kind) == 0 and pool.provisioner is None:
        return Waiting("slots", f"pool {name} has 0 {kind} slots: {key} = 0{_limited(facts, key)}")
    mine = [w for w in workers if w.pool == name and w.no_lease not in ("starting", "stopping")]
    live = [w for w in mine if w.reachable and not w.draining]
    if not live:
        if pool.provisioner is not None:
            return None  # the provisioner starts workers for what is queued
        if not mine:
            return Waiting("no_worker", f"no live worker in pool {name}")
        return _several([worker_waiting(facts, w, kind) for w in mine]) or Waiting(
            "no_worker", f"no live worker in pool {name}"
        )
    if image:
        live = [w for w in live if w.image == image]
        if not live:
            return Waiting("image", f"no live worker of pool {name} runs image {image}")
    rooms = [w.room_mb for w in live if w.room_mb is not None]
    if grant_mb and rooms and len(rooms) == len(live) and grant_mb > max(rooms):  # one that sent no room takes any
        return Waiting(
            "grant",
            f"its grant of {format_memory(grant_mb)} is larger than the room of every live worker of pool {name} "
            f"(the most: {format_memory(max(rooms))})",
        )
    return _several([worker_waiting(facts, w, kind) for w in live])


def _several(reasons: list[Waiting | None]) -> Waiting | None:
    """None when a worker may take the job; else each worker's reason, three at most, under the first one's code."""
    if not reasons or any(r is None for r in reasons):
        return None
    got = [r for r in reasons if r is not None]
    text = "; ".join(r.text for r in got[:3]) + (f"; and {len(got) - 3} more worker(s)" if len(got) > 3 else "")
    return Waiting(got[0].code, text)
