"""A cgroup's memory limit read through the seam the worker uses (`cgroupmem.limit(root, proc_cgroup)`), on fake
cgroup roots: v2 inside a container (its group at the root), v2 nested under a limited ancestor, v1, no limit.
tests/integration/test_memory_limit.py runs a real worker in a real limited group."""

from __future__ import annotations

from pathlib import Path

import pytest

from piloop_common.host import cgroupmem
from piloop_common.host.cgroupmem import CgroupMemory

MiB = 1 << 20


def v2(root: Path, proc: str, groups: dict[str, tuple[str, int, int]]) -> Path:
    """A fake v2 hierarchy at `root`: each group's (memory.max, memory.current, inactive_file); the proc file."""
    (root / "cgroup.controllers").parent.mkdir(parents=True, exist_ok=True)
    (root / "cgroup.controllers").write_text("cpu io memory pids\n")
    for rel, (mx, current, inactive) in groups.items():
        d = root / rel
        d.mkdir(parents=True, exist_ok=True)
        (d / "memory.max").write_text(mx + "\n")
        (d / "memory.current").write_text(f"{current}\n")
        (d / "memory.stat").write_text(f"anon 1\nfile 2\nactive_file 3\ninactive_file {inactive}\nslab 4\n")
    pc = root.parent / "proc-cgroup"
    pc.write_text(f"0::{proc}\n")
    return pc


def test_a_container_limit_at_the_root(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    pc = v2(root, "/", {".": (str(2048 * MiB), 1024 * MiB, 256 * MiB)})
    got = cgroupmem.limit(root, pc)
    assert got == CgroupMemory(root, 2048 * MiB, 768 * MiB) and got.available == 1280 * MiB
    assert cgroupmem.available_bytes(20_000 * MiB, root, pc) == 1280 * MiB
    assert cgroupmem.available_bytes(1000 * MiB, root, pc) == 1000 * MiB, "the host's when it is lower"


def test_the_tightest_ancestor_binds(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    pc = v2(
        root,
        "/system.slice/piloop.service",
        {
            "system.slice": (str(1024 * MiB), 900 * MiB, 0),  # the slice: 124 MiB left
            "system.slice/piloop.service": (str(4096 * MiB), 100 * MiB, 0),
        },
    )
    got = cgroupmem.limit(root, pc)
    assert got is not None and got.group == root / "system.slice" and got.available == 124 * MiB


def test_a_container_without_its_own_namespace_sees_its_group_at_the_root(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    pc = v2(root, "/docker/3f2a9c1b7d4e", {".": (str(512 * MiB), 100 * MiB, 0)})  # the host's path is not there
    got = cgroupmem.limit(root, pc)
    assert got is not None and got.limit == 512 * MiB and got.available == 412 * MiB


def test_no_limit(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    pc = v2(root, "/user.slice", {"user.slice": ("max", 100 * MiB, 0)})
    assert cgroupmem.limit(root, pc) is None
    assert cgroupmem.available_bytes(777, root, pc) == 777
    assert cgroupmem.limit(tmp_path / "nothing", pc) is None, "no cgroup hierarchy at all"


def test_v1_memory_controller(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    mem = root / "memory"
    group = mem / "process_api" / "abc"
    group.mkdir(parents=True)
    (mem / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # v1's "no limit"
    (mem / "memory.usage_in_bytes").write_text(f"{8000 * MiB}\n")
    (group / "memory.limit_in_bytes").write_text(f"{1024 * MiB}\n")
    (group / "memory.usage_in_bytes").write_text(f"{600 * MiB}\n")
    (group / "memory.stat").write_text(f"cache 1\ninactive_file 5\ntotal_inactive_file {100 * MiB}\n")
    pc = tmp_path / "proc-cgroup"
    pc.write_text("9:name=systemd:/\n4:memory:/process_api/abc\n0::/\n")
    got = cgroupmem.limit(root, pc)
    assert got == CgroupMemory(group, 1024 * MiB, 500 * MiB)


def test_the_workers_room_and_sample_take_the_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from piloop_common.host.sample import sample
    from piloop_worker import room

    root = tmp_path / "cg"
    pc = v2(root, "/", {".": (str(1536 * MiB), 512 * MiB, 0)})
    monkeypatch.setattr(cgroupmem, "CGROUP_ROOT", root)
    monkeypatch.setattr(cgroupmem, "PROC_CGROUP", pc)
    monkeypatch.delenv(room.AVAILABLE_ENV, raising=False)
    assert room.available_mb() == 1024
    assert sample(tmp_path).memory_available_gb == round(1024 * MiB / 1e9, 3)
    monkeypatch.setenv(room.AVAILABLE_ENV, "300")
    assert room.available_mb() == 300, "the variable still wins"
