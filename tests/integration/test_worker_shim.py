"""The shim, forked from a real shim host: its own session and process group, self-fencing by the
deadline in the job's dir (even when the worker or the host is SIGKILLed), stop, timeout, usage, OOM; a shim whose
job ended runs the next one (and fences it alike), and ends with its host or when killed idle."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from piloop_worker import clock
from piloop_worker.jobdir import JobDir, read_json
from piloop_worker.shimhost import ShimHost
from piloop_worker.shimproto import CgroupGrant, ExitRecord, ShimRequest, StopReason
from tests.helpers.jobrecords import job_record
from tests.helpers.redis import wait_for
from tests.helpers.slowdown import scaled

# A job whose tree has a background child in its group and one that left it (setsid), each pid written down.
TREE = "sleep 1000 & echo $! >> pids; setsid sleep 1000 & echo $! >> pids; echo $$ >> pids; wait"


@pytest.fixture(scope="module")
def host():
    h = ShimHost().start()
    yield h
    h.close()


@pytest.fixture
def own_host():
    h = ShimHost().start()
    yield h
    h.close()


def _job(tmp_path: Path, name: str = "j1") -> JobDir:
    jd = JobDir.for_lease(tmp_path / "data", name, "1")
    jd.create(job_record(name, "1"))
    return jd


def _start(host: ShimHost, jd: JobDir, argv: list[str], deadline_in: float = 60.0, **req) -> None:
    jd.write_deadline(clock.now() + deadline_in)
    host.run_job(
        ShimRequest(str(jd.root), argv, req.pop("env", {}), kill_grace=req.pop("kill_grace", 0.3), **req)
    )  # env: set over the host's env


def _pids(jd: JobDir, n: int) -> list[int]:
    f = jd.work / "pids"
    return wait_for(
        lambda: f.exists() and len(ps := [int(x) for x in f.read_text().split()]) >= n and ps, 10, what="the job's pids"
    )


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _exit(jd: JobDir, timeout: float = 10) -> ExitRecord:
    return wait_for(jd.exit_record, timeout, what=f"{jd.exit_json}")


def test_a_job_runs_in_its_own_session_and_process_group(host, tmp_path):
    jd = _job(tmp_path)
    script = (
        "import os; print(os.getsid(0), os.getpgid(0), os.getpid(), os.environ['X'], os.environ['PATH'], flush=True)"
    )
    _start(host, jd, [sys.executable, "-c", script], env={"X": "x1"})
    rec = _exit(jd)
    assert rec.exit_code == 0 and rec.stopped == "" and rec.usage.peak_rss_bytes > 0
    sid, pgid, pid, x, path = jd.output_log.read_text().split()
    shim = read_json(jd.shim_json)
    assert int(sid) == shim["shim"] != os.getsid(0)  # the shim leads a session of its own
    assert int(pgid) == int(pid) == shim["pid"]  # the job leads its own process group
    assert x == "x1" and path == os.environ["PATH"]  # its env, set over the host's (the worker's)
    # the exit record is written just before the shim drops its lock (and exits, or waits idle for another job)
    wait_for(lambda: not jd.shim_alive(), 5, what="the shim to let the dir go")


def test_a_passed_deadline_kills_the_whole_tree(host, tmp_path):
    jd = _job(tmp_path)
    _start(host, jd, ["sh", "-c", TREE], deadline_in=1.0)
    pids = _pids(jd, 3)
    assert not any(_gone(p) for p in pids) and jd.shim_alive()
    rec = _exit(jd)
    assert rec.stopped == "fenced" and rec.signal == signal.SIGTERM
    assert rec.usage._fields == ("peak_rss_bytes", "cpu_seconds") and rec.usage.peak_rss_bytes > 0
    assert all(_gone(p) for p in pids), [p for p in pids if not _gone(p)]
    wait_for(lambda: not jd.shim_alive(), 5, what="the shim to exit")  # it drops its lock just after the record


def test_renewed_deadlines_keep_a_job_alive(host, tmp_path):
    jd = _job(tmp_path)
    _start(host, jd, ["sleep", "1.5"], deadline_in=0.6)
    end = time.monotonic() + scaled(5)
    while not jd.exit_json.exists() and time.monotonic() < end:
        jd.write_deadline(clock.now() + 0.6)  # as each acknowledged heartbeat does
        time.sleep(0.1)
    assert _exit(jd).exit_code == 0


def test_stop_file_stops_it_with_the_reason(host, tmp_path):
    jd = _job(tmp_path)
    _start(host, jd, ["sh", "-c", "trap '' TERM; " + TREE], kill_grace=0.3)  # ignores SIGTERM: SIGKILL follows
    pids = _pids(jd, 3)
    jd.request_stop(StopReason.CANCELLED)
    rec = _exit(jd)
    assert rec.stopped == "cancelled" and rec.signal == signal.SIGKILL
    assert all(_gone(p) for p in pids)


def test_timeout_kills_it(host, tmp_path):
    jd = _job(tmp_path)
    t0 = time.monotonic()
    _start(host, jd, ["sleep", "100"], timeout=0.5)
    rec = _exit(jd)
    assert rec.stopped == "timeout" and time.monotonic() - t0 < 5


def test_a_command_that_cannot_start_is_recorded(own_host, tmp_path):
    jd = _job(tmp_path)
    _start(own_host, jd, ["/no/such/program"])
    rec = _exit(jd)
    assert rec.exit_code == 127 and "cannot start '/no/such/program'" in rec.reason
    assert own_host.wait_exit(5) and len(own_host.idle) == 1  # its word said so: the shim takes the next job


OWNER = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    from piloop_worker import clock
    from piloop_worker.jobdir import JobDir
    from piloop_worker.shimhost import ShimHost
    from piloop_worker.shimproto import ShimRequest
    h = ShimHost().start()
    jd = JobDir(Path(sys.argv[1]))
    jd.write_deadline(clock.now() + float(sys.argv[2]))
    h.run_job(ShimRequest(str(jd.root), ["sh", "-c", sys.argv[3]], dict(os.environ), kill_grace=0.3))
    print(h.pid, flush=True)
    time.sleep(1000)
""")


@pytest.mark.parametrize("victim", ["worker", "shim host"])
def test_sigkilled_worker_or_host_still_fences_its_job_by_the_deadline(tmp_path, victim):
    jd = _job(tmp_path)
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(jd.root), "3", TREE], stdout=subprocess.PIPE, text=True)
    try:
        host_pid = int(owner.stdout.readline())
        pids = _pids(jd, 3)
        deadline = jd.read_deadline()
        os.kill(owner.pid if victim == "worker" else host_pid, signal.SIGKILL)
        if victim == "worker":
            owner.wait(5)
            wait_for(lambda: _gone(host_pid), 5, what="the shim host to exit with its worker")
        assert clock.now() < deadline and not any(_gone(p) for p in pids)  # alive until the deadline
        rec = _exit(jd, timeout=10)
        assert rec.stopped == "fenced" and clock.now() >= deadline
        assert all(_gone(p) for p in pids)
    finally:
        owner.kill()
        owner.wait(5)


def test_out_of_memory_in_the_job_cgroup_is_recorded(host, tmp_path, job_cgroups):
    jd = _job(tmp_path)
    cg = job_cgroups.take(64)
    _start(
        host,
        jd,
        [sys.executable, "-c", "b = bytearray(400 * 1024 * 1024); b[::4096] = b'x' * len(b[::4096])"],
        cgroup=CgroupGrant(str(cg.path), cg.version),
    )
    rec = _exit(jd, timeout=30)
    assert rec.oom is True and rec.signal == signal.SIGKILL
    # the group stays for the worker to keep for a later job: the counter its first job raised is not the next one's
    assert cg.path.is_dir() and cg.pids() == []
    again = _job(tmp_path, "again")
    _start(host, again, ["true"], cgroup=CgroupGrant(str(cg.path), cg.version))
    rec = _exit(again)
    assert rec.exit_code == 0 and rec.oom is False, rec


def test_the_job_is_in_its_cgroup_from_its_start_and_the_shim_is_not(host, tmp_path, job_cgroups):
    """The shim enters the job's group only for the spawn (so a vfork'd child is born there), then goes back."""
    jd = _job(tmp_path)
    cg = job_cgroups.take(256)
    script = f"cat /proc/self/cgroup > first; while [ ! -f go ]; do sleep 0.02; done; cat {cg.join_path()} > members"
    _start(host, jd, ["sh", "-c", script], cgroup=CgroupGrant(str(cg.path), cg.version))
    first = wait_for(lambda: (jd.work / "first").exists() and (jd.work / "first").read_text(), 10, what="first")
    group = "/" + cg.path.relative_to(cg.path.parents[2]).as_posix()  # <base's parent>/<base>/<job>
    assert any(line.endswith(group) for line in first.splitlines()), (group, first)
    shim = wait_for(lambda: read_json(jd.shim_json), 10, what="shim.json")
    (jd.work / "go").write_text("")
    rec = _exit(jd)
    assert rec.exit_code == 0, jd.output_log.read_text()
    members = {int(x) for x in (jd.work / "members").read_text().split()}
    assert shim["pid"] in members and shim["shim"] not in members
    own = Path(f"/proc/{shim['shim']}/cgroup")
    assert not own.exists() or group not in own.read_text()
    assert shim["cgroup"] == str(cg.path)  # where a restarted worker finds the group
    assert cg.path.is_dir()  # the worker's to keep or remove


def test_a_shim_whose_worker_is_gone_removes_its_jobs_cgroup(own_host, tmp_path, job_cgroups):
    """Nobody would keep the group for a later job: the shim removes it once its job has ended."""
    jd = _job(tmp_path)
    cg = job_cgroups.take(64)
    _start(
        own_host,
        jd,
        ["sh", "-c", "while [ ! -f go ]; do sleep 0.02; done"],
        cgroup=CgroupGrant(str(cg.path), cg.version),
    )
    wait_for(lambda: read_json(jd.shim_json), 10, what="shim.json")
    assert own_host.exits is not None
    own_host.exits.close()  # the worker's end of the wake-up pair, as when the worker dies
    own_host.exits = None
    (jd.work / "go").write_text("")
    assert _exit(jd).exit_code == 0
    wait_for(lambda: not cg.path.exists(), 10, what="the group removed")


def _ended(jd: JobDir) -> ExitRecord:
    """The job's exit record, once its shim is idle: it let the dir go and waits for its next request. A request
    sent sooner would rightly go to a fresh fork (the shim had not said `idle` yet)."""
    rec = _exit(jd)
    wait_for(lambda: not jd.shim_alive(), 5, what="the shim to let the dir go")
    shim = read_json(jd.shim_json)["shim"]

    def waiting() -> bool:  # blocked in its channel's recv (a datagram wait), where it says idle first
        try:
            where = Path(f"/proc/{shim}/wchan").read_text()
        except OSError:
            return True  # gone: nothing to wait for
        return where == "0" or "wait_for_more_packets" in where  # "0": a kernel that hides it

    wait_for(waiting, 5, what="the shim to wait for its next request")
    return rec


def test_a_shim_whose_job_ended_runs_the_next_job_and_fences_it_alike(own_host, tmp_path):
    a, b, c = (_job(tmp_path, n) for n in ("ja", "jb", "jc"))
    _start(own_host, a, ["sh", "-c", "echo a; echo $(ps -o sid= -p $$) > sid"])
    assert _ended(a).exit_code == 0
    shim = read_json(a.shim_json)["shim"]
    log_a = a.shim_log.stat().st_size
    _start(own_host, b, ["sh", "-c", "echo b; echo $(ps -o sid= -p $$) > sid"])
    assert _ended(b).exit_code == 0
    assert read_json(b.shim_json)["shim"] == shim  # the same shim, not a new fork
    assert read_json(b.shim_json)["pid"] != read_json(a.shim_json)["pid"]
    assert int((b.work / "sid").read_text()) == int((a.work / "sid").read_text()) == shim  # its session, as before
    assert a.output_log.read_text() == "a\n" and b.output_log.read_text() == "b\n"
    assert a.shim_log.stat().st_size == log_a  # nothing of the second job in the first one's dir
    # the third job on the same shim: fenced at its deadline, its whole tree with it
    _start(own_host, c, ["sh", "-c", TREE], deadline_in=1.0)
    pids = _pids(c, 3)
    rec = _ended(c)
    assert read_json(c.shim_json)["shim"] == shim
    assert rec.stopped == "fenced" and all(_gone(p) for p in pids)


def test_a_shim_whose_word_was_lost_is_marked_idle_from_the_exit_record(own_host, tmp_path):
    """The worker learns a shim is idle from its word on the wake-up pair; where the word is lost (a full buffer), the
    worker's reading of the job's exit record (`ShimHost.ended`) does it, and the next job goes to the same shim."""
    a, b, c = (_job(tmp_path, n) for n in ("la", "lb", "lc"))
    _start(own_host, a, ["true"])
    _ended(a)
    assert own_host.exits is not None
    assert own_host.exits.recv(512) == a.root.name.encode()  # the word, taken here: the worker never hears it
    shim = read_json(a.shim_json)["shim"]
    _start(own_host, b, ["true"])
    _ended(b)
    assert read_json(b.shim_json)["shim"] != shim  # not known idle: a fresh fork took the job
    assert own_host.wait_exit(5)  # b's word, heard: its shim is idle
    own_host.ended(a.root.name, last=False)  # now the first one too, idle the shortest: the next job is its
    _start(own_host, c, ["true"])
    assert _ended(c).exit_code == 0 and read_json(c.shim_json)["shim"] == shim


def test_an_idle_shim_ends_with_its_host_and_one_killed_idle_is_replaced(tmp_path):
    h = ShimHost().start()
    try:
        a, b, c = (_job(tmp_path, n) for n in ("ka", "kb", "kc"))
        _start(h, a, ["true"])
        _ended(a)
        first = read_json(a.shim_json)["shim"]
        os.kill(first, signal.SIGKILL)  # idle: no job goes with it
        wait_for(lambda: _gone(first), 5, what="the idle shim to die")
        _start(h, b, ["true"])
        assert _ended(b).exit_code == 0
        second = read_json(b.shim_json)["shim"]
        assert second != first
        _start(h, c, ["true"])
        assert _ended(c).exit_code == 0 and read_json(c.shim_json)["shim"] == second
    finally:
        h.close()
    wait_for(lambda: _gone(second), 5, what="the idle shim to end with its host")


def test_a_shim_sent_sigterm_stops_its_job_and_takes_no_other(own_host, tmp_path):
    jd = _job(tmp_path, "ta")
    _start(own_host, jd, ["sh", "-c", TREE])
    pids = _pids(jd, 3)
    shim = wait_for(lambda: read_json(jd.shim_json), 10, what="shim.json")["shim"]
    os.kill(shim, signal.SIGTERM)
    rec = _exit(jd)
    assert rec.stopped == "shim terminated" and all(_gone(p) for p in pids)
    own_host.wait_exit(5)  # its word says it ends: the worker never sends it a job, even before it is gone
    assert own_host.idle == [] and own_host.busy == {}
    wait_for(lambda: _gone(shim), 5, what="the terminated shim to exit rather than wait for another job")
    nxt = _job(tmp_path, "tb")
    _start(own_host, nxt, ["true"])
    assert _ended(nxt).exit_code == 0 and read_json(nxt.shim_json)["shim"] != shim
