"""Capacity: a worker's slots per kind, and why it got no lease."""

from __future__ import annotations

from piloop_common.config import PoolConfig
from piloop_common.protocol import HostSample


def host_reason(pool: PoolConfig, sample: HostSample | None, admission: str = "") -> str:
    """Why this host takes no job now ('' when it may): load, memory, or the worker's own admission."""
    if sample is None:
        return ""
    if sample.load_per_cpu > pool.max_load:
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
