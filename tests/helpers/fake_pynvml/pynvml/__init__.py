"""A fake of the part of NVML's bindings (`nvidia-ml-py`, imported as `pynvml`) that piloop_worker/gpus.py uses, for
tests (put its parent, tests/helpers/fake_pynvml, on PYTHONPATH).

Two GPUs with the fixed figures in `GPUS`. When FAKE_PYNVML_LOG names a file, each call that matters appends
`<call> <pid>` there: `init`, `count` (one a sample), `shutdown`. FAKE_PYNVML_MODE=missing makes `nvmlInit` raise
`NVMLError_LibraryNotFound`, as the real bindings do on a machine without NVIDIA's driver.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

MIB = 2**20
# (utilization %, memory used MiB, memory total MiB) of each GPU
GPUS = ((37, 1024, 81920), (81, 40960, 81920))
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_UNINITIALIZED = 1


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value


class NVMLError_LibraryNotFound(NVMLError):  # the real bindings' name
    def __str__(self) -> str:
        return "NVML Shared Library Not Found"


class NVMLError_Uninitialized(NVMLError):
    def __str__(self) -> str:
        return "Uninitialized"


@dataclass
class _Utilization:
    gpu: int
    memory: int


@dataclass
class _Memory:
    total: int
    free: int
    used: int


_initialised = 0


def _log(call: str) -> None:
    path = os.environ.get("FAKE_PYNVML_LOG")
    if path:
        with open(path, "a") as f:
            f.write(f"{call} {os.getpid()}\n")


def _check() -> None:
    if not _initialised:
        raise NVMLError_Uninitialized(NVML_ERROR_UNINITIALIZED)


def nvmlInit() -> None:
    global _initialised
    _log("init")
    if os.environ.get("FAKE_PYNVML_MODE") == "missing":
        raise NVMLError_LibraryNotFound(NVML_ERROR_LIBRARY_NOT_FOUND)
    _initialised += 1


def nvmlShutdown() -> None:
    global _initialised
    _check()
    _log("shutdown")
    _initialised -= 1


def nvmlDeviceGetCount() -> int:
    _check()
    _log("count")
    return len(GPUS)


def nvmlDeviceGetHandleByIndex(index: int) -> int:
    _check()
    return index


def nvmlDeviceGetUtilizationRates(handle: int) -> _Utilization:
    _check()
    return _Utilization(gpu=GPUS[handle][0], memory=0)


def nvmlDeviceGetMemoryInfo(handle: int) -> _Memory:
    _check()
    _, used, total = GPUS[handle]
    return _Memory(total=total * MIB, free=(total - used) * MIB, used=used * MIB)
