"""A worker in a memory-limited cgroup (as in a container with a memory limit) grants no more than the limit leaves
it: a real `piloop worker` started inside a real memory cgroup of 1 GiB advertises a room within it, and once the
limit is raised to 3 GiB its advertised room follows. The host's available memory here is far above both."""

from __future__ import annotations

import contextlib
import json
import sys
import uuid

import psutil
import pytest

from piloop_worker.cgroups import Cgroups
from tests.helpers.redis import wait_for
from tests.helpers.workers import tcp_server, token

MiB = 1 << 20
POOL = """
[plugins.executor.pools.lim]
agents = 0
evaluations = 2
max_load = 1000
min_memory_gb = 0
memory_reserve_mb = 256
"""
NAME = f"limtest-{uuid.uuid4().hex[:8]}"
CGROUPS = Cgroups(NAME)  # a probe: the fixture makes the groups
if CGROUPS.available:
    CGROUPS.base.rmdir()
needs_cgroups = pytest.mark.skipif(
    not CGROUPS.available, reason=f"no writable memory cgroup here ({CGROUPS.reason}): no limit to put a worker in"
)


def _raise_limit(cg, mb: int) -> None:
    if cg.version == 2:
        (cg.path / "memory.max").write_text(str(mb * MiB))
        return
    # v1 keeps memory+swap's limit at or above memory's: raise it first (where the kernel counts swap)
    with contextlib.suppress(FileNotFoundError):
        (cg.path / "memory.memsw.limit_in_bytes").write_text(str(mb * MiB))
    (cg.path / "memory.limit_in_bytes").write_text(str(mb * MiB))


def _room(d, name: str) -> int | None:
    rows = json.loads(d.cli("worker", "list", "--json", check=True).stdout)
    row = next((r for r in rows if r["name"] == name), None)
    return row["room_mb"] if row and row["reachable"] else None


@pytest.fixture
def limited(redis_server, namespace, workers):
    assert psutil.virtual_memory().available > 4096 * MiB, "this test needs a host with more room than its limits"
    d = tcp_server(redis_server.url, namespace, extra=POOL)
    cg = Cgroups(NAME).create("worker", 1024)
    # the worker joins the group before it execs, so it, its shim host and its jobs are charged there
    enter = ("sh", "-c", 'echo $$ > "$0" && exec "$@"', str(cg.join_path()), sys.executable, "-m", "piloop_common.cli")
    w = workers(d, token(d, "lim1", "--pool", "lim"), pool="lim", command=enter).start()
    yield d, w, cg
    w.cleanup()
    d.cleanup()
    wait_for(lambda: not cg.pids(), 10, what="the cgroup to empty")
    _remove_tree(cg.path.parent)  # the worker made its jobs' base inside its own group


def _remove_tree(group) -> None:
    for sub in sorted((p for p in group.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        sub.rmdir()
    group.rmdir()


@needs_cgroups
def test_the_room_follows_the_cgroup_limit(limited):
    d, w, cg = limited
    room = wait_for(lambda: _room(d, "lim1"), 30, what="the worker's first room")
    assert 0 < room <= 1024 - 256, (room, w.output())
    _raise_limit(cg, 3072)
    room = wait_for(lambda: (r := _room(d, "lim1")) and r > 1024 and r, 30, what="the room to grow with the limit")
    assert room <= 3072 - 256, room
