"""Memory-pressure admission: a host whose PSI `some avg10` is over the server's maximum claims nothing."""

from __future__ import annotations

import os
from pathlib import Path

from piloop_common.host.sample import PSI_MEMORY
from piloop_common.protocol.worker import HostSample

PSI_ENV = "PILOOP_PSI_MEMORY"


def psi_path() -> Path:
    """Where this worker reads memory pressure: `PILOOP_PSI_MEMORY` names a file in /proc/pressure/memory's
    format (a cgroup's `memory.pressure`, or a file a test controls), else /proc/pressure/memory."""
    return Path(os.environ.get(PSI_ENV) or PSI_MEMORY)


def admission(sample: HostSample, memory_pressure_max: float) -> str:
    """Why this worker itself should claim nothing now (`memory`), or "" to claim."""
    if sample.memory_pressure is not None and sample.memory_pressure > memory_pressure_max:
        return "memory"
    return ""
