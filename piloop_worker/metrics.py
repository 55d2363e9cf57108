"""Host metrics beside each job, one JSON line every few seconds: CPU, memory, disk, and GPUs where
`nvidia-smi` answers. Written by the job's shim to `metrics.jsonl`, sent to the CAS with the report."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil

GPU_FIELDS = ("index", "utilization.gpu", "memory.used", "memory.total")


def gpus(timeout: float = 2.0) -> list[dict[str, Any]] | None:
    """Each GPU's utilization (%) and memory (MiB), or None where there is no `nvidia-smi`."""
    import shutil  # here: the shim host imports this module, and shutil brings zlib, bz2 and lzma

    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        out = subprocess.run(
            [exe, f"--query-gpu={','.join(GPU_FIELDS)}", "--format=csv,noheader,nounits"],
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
        if len(vals) == len(GPU_FIELDS):
            try:
                rows.append(
                    {
                        "index": int(vals[0]),
                        "util_percent": float(vals[1]),
                        "memory_used_mb": float(vals[2]),
                        "memory_total_mb": float(vals[3]),
                    }
                )
            except ValueError:
                continue
    return rows


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
    g = gpus()
    if g is not None:
        row["gpus"] = g
    return row


def append(path: Path, disk_path: Path) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(line(disk_path)) + "\n")
