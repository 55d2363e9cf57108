"""A sample of this host for the server: CPUs, load, free memory (less where a cgroup limit leaves less) and disk,
memory pressure (PSI).

`sample()` may be slow on a sick host (a hung NFS mount under `--dir`), so callers that must
not wait use `Sampler`, which refreshes in its own thread and answers from its cache.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import psutil

from piloop_common.host import cgroupmem
from piloop_common.protocol.worker import HostSample

PSI_MEMORY = Path("/proc/pressure/memory")


def parse_psi(text: str) -> dict[str, dict[str, float]]:
    """`/proc/pressure/*` as {"some": {"avg10": ..., "avg60": ..., "avg300": ..., "total": ...}, "full": {...}}."""
    out: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        fields: dict[str, float] = {}
        for kv in parts[1:]:
            k, sep, v = kv.partition("=")
            if sep:
                try:
                    fields[k] = float(v)
                except ValueError:
                    continue
        out[parts[0]] = fields
    return out


def memory_pressure(path: Path = PSI_MEMORY) -> float | None:
    """PSI memory `some avg10` (%), or None where the kernel has no PSI (or it is off)."""
    try:
        return parse_psi(path.read_text()).get("some", {}).get("avg10")
    except OSError:
        return None


def sample(disk_path: Path | str = "/", psi_path: Path = PSI_MEMORY) -> HostSample:
    """Take one sample now (it reads /proc and statvfs; it may block on a sick filesystem)."""
    path = Path(disk_path)
    while not path.exists() and path != path.parent:
        path = path.parent
    return HostSample(
        cpus=psutil.cpu_count() or 1,
        load1=round(os.getloadavg()[0], 2),
        memory_available_gb=round(cgroupmem.available_bytes(int(psutil.virtual_memory().available)) / 1e9, 3),
        disk_free_gb=round(psutil.disk_usage(str(path)).free / 1e9, 3),
        memory_pressure=memory_pressure(psi_path),
    )


class Sampler:
    """A time-boxed, cached `sample()`: `get()` never waits longer than `timeout` seconds."""

    def __init__(
        self, disk_path: Path | str = "/", max_age: float = 5.0, timeout: float = 1.0, psi_path: Path = PSI_MEMORY
    ) -> None:
        self.disk_path, self.max_age, self.timeout, self.psi_path = disk_path, max_age, timeout, psi_path
        self._lock = threading.Lock()
        self._cached: HostSample | None = None
        self._at = 0.0
        self._running: threading.Thread | None = None
        self._done = threading.Event()

    def _refresh(self) -> None:
        try:
            got = sample(self.disk_path, self.psi_path)
        except Exception:  # noqa: BLE001 -- a failed sample keeps the last good one
            got = None
        with self._lock:
            if got is not None:
                self._cached, self._at = got, time.monotonic()
            self._running = None
        self._done.set()

    def get(self) -> HostSample:
        """The freshest sample available within the time box (a fallback one if none ever finished)."""
        with self._lock:
            fresh = self._cached is not None and time.monotonic() - self._at < self.max_age
            if not fresh and self._running is None:
                self._done.clear()
                self._running = threading.Thread(target=self._refresh, name="host-sample", daemon=True)
                self._running.start()
            cached = self._cached
        if cached is not None:
            return cached  # a stale sample now beats a fresh one late; the refresh runs behind
        self._done.wait(self.timeout)
        with self._lock:
            if self._cached is not None:
                return self._cached
        return HostSample(cpus=os.cpu_count() or 1, load1=0.0, memory_available_gb=0.0, disk_free_gb=0.0)
