"""A worker's job cgroups, made in the real memory hierarchy: kept empty for a later job, their limit rewritten only
when it changes (v1 in the order the kernel accepts), never kept while a process is in one, and swept at a start."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from piloop_worker.cgroups import Cgroups, JobCgroup


def _limit(cg: JobCgroup) -> int:
    return int((cg.path / ("memory.max" if cg.version == 2 else "memory.limit_in_bytes")).read_text())


def _groups(c: Cgroups) -> set[str]:
    assert c.base is not None
    return {p.name for p in c.base.iterdir() if p.is_dir()}


def _inside(cg: JobCgroup) -> subprocess.Popen:
    """A process in `cg` until killed."""
    p = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    cg.join_path().write_text(str(p.pid))
    return p


def test_a_group_given_back_empty_is_taken_again_at_the_next_jobs_limit(job_cgroups):
    a = job_cgroups.take(64)
    assert a.path.name == f"{os.getpid()}-1" and _limit(a) == 64 << 20
    job_cgroups.give(a)
    assert job_cgroups.take(64) == a and _limit(a) == 64 << 20
    job_cgroups.give(a)
    # raised past its old limit (v1: memsw first, or the kernel refuses the limit above it) and lowered again
    assert job_cgroups.take(256) == a and _limit(a) == 256 << 20
    if a.version == 1 and (memsw := a.path / "memory.memsw.limit_in_bytes").exists():
        assert int(memsw.read_text()) == 256 << 20
    job_cgroups.give(a)
    assert job_cgroups.take(32) == a and _limit(a) == 32 << 20
    b = job_cgroups.take(32)  # none spare: a new one
    assert b.path.name == f"{os.getpid()}-2" and _groups(job_cgroups) == {a.path.name, b.path.name}


def test_a_group_with_a_process_in_it_is_never_kept(job_cgroups):
    a = job_cgroups.take(64)
    p = _inside(a)
    try:
        job_cgroups.give(a)
        assert a.path.is_dir() and a.pids() == [p.pid]  # the kernel refused its removal; it is not a spare either
        assert job_cgroups.take(64) != a
        assert a.path.name not in {x.path.name for x in job_cgroups.spare}
    finally:
        p.kill()
        p.wait()


def test_a_group_made_by_another_worker_is_removed_when_given(job_cgroups):
    assert job_cgroups.base is not None
    (job_cgroups.base / "111-1").mkdir()
    # a re-attached job's, named in its shim.json
    job_cgroups.give(JobCgroup(job_cgroups.base / "111-1", job_cgroups.version))
    assert _groups(job_cgroups) == set() and job_cgroups.spare == []


def test_spares_past_the_most_are_removed_and_close_removes_the_rest(job_cgroups, monkeypatch):
    monkeypatch.setattr(Cgroups, "MOST", 2)
    taken = [job_cgroups.take(16) for _ in range(3)]
    for cg in taken:
        job_cgroups.give(cg)
    assert len(job_cgroups.spare) == 2 and len(_groups(job_cgroups)) == 2
    job_cgroups.close()
    assert _groups(job_cgroups) == set() and job_cgroups.limits == {}


def test_a_start_sweeps_empty_groups_but_not_a_live_jobs_or_a_live_workers(job_cgroups):
    assert job_cgroups.base is not None
    live_worker = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    dead = _dead_pid()
    for name in (f"{dead}-1", f"{dead}-2", f"{live_worker.pid}-1", "j-old"):
        (job_cgroups.base / name).mkdir()
    busy = JobCgroup(job_cgroups.base / f"{dead}-2", job_cgroups.version)
    p = _inside(busy)
    try:
        gone = job_cgroups.sweep(keep={job_cgroups.base / "j-old"})
        # the dead worker's empty group goes; its busy one (the kernel refuses), a live worker's and a kept one stay
        assert gone == [job_cgroups.base / f"{dead}-1"]
        assert _groups(job_cgroups) == {f"{dead}-2", f"{live_worker.pid}-1", "j-old"}
    finally:
        for proc in (p, live_worker):
            proc.kill()
            proc.wait()


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    assert not Path(f"/proc/{p.pid}").exists()
    return p.pid
