"""Memory-pressure admission: a host whose PSI `some avg10` is over the server's maximum claims nothing."""

from __future__ import annotations

from piloop_common.protocol import HostSample


def admission(sample: HostSample, memory_pressure_max: float) -> str:
    """Why this worker itself should claim nothing now (`memory`), or "" to claim."""
    if sample.memory_pressure is not None and sample.memory_pressure > memory_pressure_max:
        return "memory"
    return ""
