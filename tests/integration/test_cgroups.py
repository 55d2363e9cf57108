"""A worker's job cgroups, made in the real memory hierarchy: kept empty for a later job, their limit rewritten only
when it changes (v1 in the order the kernel accepts), never kept while a process is in one, and swept at a start; a
group's peak memory, which sampling misses, counted from a reset, so a kept group's next job has its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from piloop_worker.cgroups import Cgroups, JobCgroup, PeakWatch
from piloop_worker.usage import Meter

MiB = 1 << 20
# joins its group, then at each line on stdin: touches the MiB the line gives, frees them and says so (an empty line
# ends it)
SPIKE = """
import sys
for line in sys.stdin:
    if not line.strip():
        break
    b = b'\\x01' * (int(line) << 20)
    del b
    print('freed', flush=True)
"""


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


def _spiking(cg: JobCgroup) -> subprocess.Popen:
    """A process in `cg` that touches memory when told (`_spike`)."""
    p = subprocess.Popen(
        [sys.executable, "-c", SPIKE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
    )
    cg.join_path().write_text(str(p.pid))
    return p


def _spike(p: subprocess.Popen, mb: int) -> None:
    """`mb` MiB touched and freed again by the time this returns."""
    assert p.stdin is not None and p.stdout is not None
    p.stdin.write(f"{mb}\n")
    assert p.stdout.readline() == "freed\n"


def _end(p: subprocess.Popen) -> None:
    assert p.stdin is not None
    p.stdin.write("\n")
    p.stdin.close()
    assert p.wait(10) == 0


def _watch(cg: JobCgroup) -> PeakWatch:
    w = cg.peak_watch()
    if w is None:
        pytest.skip("this kernel cannot reset a cgroup v2 peak (memory.peak, writable from Linux 6.12)")
    return w


def _group_peak(cg: JobCgroup) -> int:
    """The group's own peak counter, no reset: for a kept group, its earlier jobs' too."""
    return int((cg.path / ("memory.peak" if cg.version == 2 else "memory.max_usage_in_bytes")).read_text())


def test_a_short_peak_that_sampling_misses_is_the_groups_peak(job_cgroups):
    cg = job_cgroups.take(512)
    peak = _watch(cg)
    p = _spiking(cg)
    meter = Meter(p.pid)  # sampled as the shim samples, before and after the spike: as when it falls between two
    meter.sample()
    _spike(p, 200)
    meter.sample()
    _end(p)
    assert meter.peak_rss < 100 * MiB  # what the shim reported before: the interpreter, not the 200 MiB
    assert 200 * MiB <= (most := peak.peak_bytes() or 0) < 300 * MiB, most


def test_a_kept_groups_peak_is_reset_for_its_next_job(job_cgroups):
    cg = job_cgroups.take(512)
    first = _watch(cg)
    p = _spiking(cg)
    _spike(p, 200)
    _end(p)
    assert (first.peak_bytes() or 0) >= 200 * MiB
    job_cgroups.give(cg)
    assert job_cgroups.take(512) == cg  # kept: its own counter still holds the first job's peak
    assert _group_peak(cg) >= 200 * MiB
    second = _watch(cg)
    p = _spiking(cg)
    _spike(p, 8)
    _end(p)
    assert 8 * MiB <= (most := second.peak_bytes() or 0) < 64 * MiB, most


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
