"""The memory this process's cgroups leave it: a container's limit (`docker run --memory`, compose's `mem_limit`, a
Kubernetes pod's), or a systemd unit's `MemoryMax`, which psutil's host-wide figure does not see.

`limit()` reads the group this process is in and each of its ancestors (cgroup v2's `memory.max`, else cgroup v1's
`memory.limit_in_bytes`) and returns the tightest: the one that leaves the least. In use is what the group is charged
less its inactive page cache (`inactive_file`, which the kernel drops before it reclaims anything else), as the
kubelet counts a container's working set. The worker's room and the host sample's available memory are the host's
figure or this, whichever is lower (docs/worker.md, "Memory grants").

Kept to `os` and `pathlib` (no dataclasses): the shim host imports this through `piloop_worker.cgroups`.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")
UNLIMITED = 1 << 60  # v1 writes "no limit" as a page-rounded 2^63 − 1


class CgroupMemory(NamedTuple):
    group: Path  # the group whose limit leaves the least
    limit: int  # bytes
    used: int  # bytes charged, less inactive page cache

    @property
    def available(self) -> int:
        return max(0, self.limit - self.used)


def own_path(controller: str | None, proc_cgroup: Path | None = None) -> str:
    """This process's cgroup path in the v2 hierarchy (controller None) or in a v1 controller's."""
    try:
        lines = (proc_cgroup or PROC_CGROUP).read_text().splitlines()
    except OSError:
        return "/"
    for line in lines:
        hid, ctrls, path = line.split(":", 2)
        if controller is None and hid == "0" and ctrls == "":
            return path
        if controller is not None and controller in ctrls.split(","):
            return path
    return "/"


def limit(root: Path | None = None, proc_cgroup: Path | None = None) -> CgroupMemory | None:
    """The tightest memory limit over this process's cgroup and its ancestors, or None where none is set.

    Each of the group's ancestors is tried down to `root` itself, since a container without its own cgroup namespace
    sees its group at `root` while /proc/self/cgroup names the host's path for it. `root` and `proc_cgroup` default
    to `CGROUP_ROOT` and `PROC_CGROUP`, read at the call (a test points them at a fake hierarchy)."""
    root = root or CGROUP_ROOT
    if (root / "cgroup.controllers").exists():
        base, rel = root, own_path(None, proc_cgroup)
        names = ("memory.max", "memory.current", "inactive_file")
    elif (root / "memory" / "memory.limit_in_bytes").exists():
        base, rel = root / "memory", own_path("memory", proc_cgroup)
        names = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
    else:
        return None
    group = base / rel.lstrip("/")
    best: CgroupMemory | None = None
    for d in (group, *group.parents):
        if not d.is_relative_to(base):  # `base in d.parents` walks a Sequence: ~14 % of a busy worker's CPU
            break
        got = _read(d, *names)
        if got is not None and (best is None or got.available < best.available):
            best = got
    return best


def _read(group: Path, max_file: str, current_file: str, inactive: str) -> CgroupMemory | None:
    try:
        raw = (group / max_file).read_text().strip()
        current = int((group / current_file).read_text().strip())
    except (OSError, ValueError):
        return None  # no such group (a path of the host's), or the root's, which has no limit files
    if not raw.isdigit() or int(raw) >= UNLIMITED:
        return None  # "max": no limit here
    cache = 0
    try:
        for line in (group / "memory.stat").read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == inactive and value.strip().isdigit():
                cache = int(value)
                break
    except OSError:
        pass
    return CgroupMemory(group, int(raw), max(0, current - cache))


def available_bytes(host_available: int, root: Path | None = None, proc_cgroup: Path | None = None) -> int:
    """`host_available` (psutil's), or less where a cgroup's limit leaves less."""
    got = limit(root, proc_cgroup)
    return host_available if got is None else min(host_available, got.available)
