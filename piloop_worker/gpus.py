"""This host's GPUs: each one's utilization and memory, for the metrics beside each job (`metrics.py`).

Read through NVML (`pynvml`, from the `piloop-jobs[gpu]` extra, `nvidia-ml-py`) where it is installed: initialised once
per process, on the first sample, and shut down when the process ends (`close`, which the shim calls before it
exits, and `atexit` for any other process). A process that NVML fails in (no driver, no library) has no GPUs for
the rest of its life, and is not asked again each sample. Only where `pynvml` is not installed is `nvidia-smi`
run, once a sample; where neither answers there are no GPUs (`None`)."""

from __future__ import annotations

import atexit
import contextlib
import os
import subprocess
import threading
from typing import Any, NamedTuple

MIB = 2**20
SMI_FIELDS = ("index", "utilization.gpu", "memory.used", "memory.total")


class Gpu(NamedTuple):
    """One GPU in one sample: utilization in %, memory in MiB (as `nvidia-smi` reports them). A NamedTuple, not a
    dataclass: the shim host imports this module, and what it imports every task's fork pays for (dataclasses
    brings inspect). `number` is the GPU's index (`index` is a tuple's method); `as_json` names it `index`."""

    number: int
    util_percent: float
    memory_used_mb: float
    memory_total_mb: float

    def as_json(self) -> dict[str, Any]:
        return {
            "index": self.number,
            "util_percent": self.util_percent,
            "memory_used_mb": self.memory_used_mb,
            "memory_total_mb": self.memory_total_mb,
        }


class _Nvml:
    """NVML in this process: whether `pynvml` is installed, and the module once initialised here."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.installed: bool | None = None  # None: not looked for yet
        self.module: Any = None
        self.pid = 0  # the process that tried NVML: a forked child tries its own (a handle is not inherited)
        self.failed = False

    def ready(self) -> Any:
        """The initialised `pynvml` module; None when NVML does not work here. Raises ImportError when `pynvml`
        is not installed."""
        with self.lock:
            if self.installed is None:
                try:
                    import pynvml  # the `gpu` extra
                except ImportError:
                    self.installed = False
                else:
                    self.installed = True
            if not self.installed:
                raise ImportError("pynvml is not installed (the piloop-jobs[gpu] extra)")
            if self.pid != os.getpid():
                import pynvml

                self.module, self.failed, self.pid = None, False, os.getpid()
                try:
                    pynvml.nvmlInit()
                except pynvml.NVMLError:  # no driver or no library (NVMLError_LibraryNotFound): no GPUs here
                    self.failed = True
                else:
                    self.module = pynvml
            return None if self.failed else self.module

    def close(self) -> None:
        with self.lock:
            module = self.module if self.pid == os.getpid() else None
            self.module, self.pid, self.failed = None, 0, False
        if module is not None:
            with contextlib.suppress(module.NVMLError):
                module.nvmlShutdown()


_nvml = _Nvml()
atexit.register(_nvml.close)


def sample(timeout: float = 2.0) -> list[Gpu] | None:
    """Each GPU's utilization and memory now; None where there are none (or nothing can say)."""
    try:
        nvml = _nvml.ready()
    except ImportError:
        return _smi(timeout)
    return None if nvml is None else _read_nvml(nvml)


def close() -> None:
    """Shut NVML down in this process, if it was initialised here (a shim ends by `os._exit`, past `atexit`)."""
    _nvml.close()


def _read_nvml(nvml: Any) -> list[Gpu] | None:
    try:
        count = nvml.nvmlDeviceGetCount()
    except nvml.NVMLError:
        return None
    out = []
    for i in range(count):
        try:  # a GPU that fell off the bus answers with an error: the others are still reported
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            util = nvml.nvmlDeviceGetUtilizationRates(handle)
            mem = nvml.nvmlDeviceGetMemoryInfo(handle)
        except nvml.NVMLError:
            continue
        out.append(Gpu(i, float(util.gpu), round(mem.used / MIB, 1), round(mem.total / MIB, 1)))
    return out


def _smi(timeout: float) -> list[Gpu] | None:
    """One `nvidia-smi` run: where `pynvml` is not installed."""
    import shutil  # here: the shim host imports this module, and shutil brings zlib, bz2 and lzma

    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        out = subprocess.run(
            [exe, f"--query-gpu={','.join(SMI_FIELDS)}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    rows = []
    for line in out.strip().splitlines():
        vals = [v.strip() for v in line.split(",")]
        if len(vals) != len(SMI_FIELDS):
            continue
        try:
            rows.append(Gpu(int(vals[0]), float(vals[1]), float(vals[2]), float(vals[3])))
        except ValueError:
            continue
    return rows
