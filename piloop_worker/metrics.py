"""Host metrics beside each job, one JSON line every few seconds: CPU, memory, disk, and GPUs where NVML (or, without
the `gpu` extra, `nvidia-smi`) answers (`gpus.py`). Written by the job's shim to `metrics.jsonl`, sent to the CAS with
the report."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import psutil

from piloop_worker import gpus


def line(disk_path: Path) -> dict[str, Any]:
    vm = psutil.virtual_memory()
    row: dict[str, Any] = {
        "t": round(time.time(), 3),
        "cpu_percent": psutil.cpu_percent(None),
        "load1": round(psutil.getloadavg()[0], 2),
        "memory_used_gb": round((vm.total - vm.available) / 1e9, 3),
        "memory_available_gb": round(vm.available / 1e9, 3),
        "disk_free_gb": round(psutil.disk_usage(str(disk_path)).free / 1e9, 3),
    }
    found = gpus.sample()
    if found is not None:
        row["gpus"] = [g.as_json() for g in found]
    return row


def append(path: Path, disk_path: Path) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(line(disk_path)) + "\n")
