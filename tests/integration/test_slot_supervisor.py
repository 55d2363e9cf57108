"""The slot supervisor (`piloop_worker.slots`): one long-lived process per slot, reused for every job, spoken to by
a `SlotHandle`. Real processes throughout: process jobs and warm tasks one after another, inline values and errors,
the warm process's retirement, two supervisors on one slot, a malformed datagram."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from piloop_common.bytecaps import INLINE_MAX_BYTES
from piloop_common.errors import Unavailable
from piloop_worker.records import CgroupGrant
from piloop_worker.slots import SlotDir, SlotHandle
from piloop_worker.slots.wire import Ended, Hello, State, encode, parse
from tests.helpers.redis import wait_for
from tests.helpers.slots import ROOT, Slot, alive, inodes, process, task
from tests.helpers.slowdown import scaled


@pytest.fixture
def slot(tmp_path: Path) -> Iterator[Slot]:
    s = Slot(tmp_path / "slots" / "0")
    s.open()
    yield s
    s.kill()


def _mtimes(s: Slot) -> tuple[int, int]:
    return os.stat(s.dir.root).st_mtime_ns, os.stat(s.dir.work).st_mtime_ns


def test_process_jobs_run_one_after_another_on_one_slot_making_no_file(slot: Slot) -> None:
    slot.run(process("true"))  # the slot's files, made once
    before, mtimes = inodes(slot.dir.root), _mtimes(slot)
    pids = set()
    for i in range(20):
        if i % 2:
            started, ended = slot.run(process("sh", "-c", "echo hi; exit 3"))
            assert ended.exit.outcome() == ("failed", "exit code 3"), ended
            assert slot.log() == "hi\n"  # this job's output alone
        else:
            started, ended = slot.run(process("true"))
            assert ended.exit.outcome() == ("succeeded", ""), ended
            assert slot.log() == ""
        assert ended.exit.started and ended.exit.ended and ended.result is None
        pids.add(started.pid)
    assert len(pids) == 20  # each job its own process
    assert inodes(slot.dir.root) == before and _mtimes(slot) == mtimes  # nothing made or removed per job
    assert not slot.dir.ended.exists()


def test_a_process_job_that_cannot_start_ends_with_its_reason_and_the_slot_runs_on(slot: Slot) -> None:
    g = slot.start(process("no-such-command-here"))
    ended = slot.wait(Ended, g)
    slot.handle.ack(g)
    assert ended.exit.exit_code == 127 and "cannot start 'no-such-command-here': exec" in ended.exit.reason
    assert slot.run(process("true"))[1].exit.outcome() == ("succeeded", "")


def test_a_job_runs_in_the_slots_work_dir_emptied_of_what_the_last_job_left(slot: Slot) -> None:
    slot.run(process("sh", "-c", "pwd; touch left; mkdir d; touch d/x"))
    assert slot.log().strip() == str(slot.dir.work)
    assert sorted(os.listdir(slot.dir.work)) == ["d", "left"]
    _, ended = slot.run(process("sh", "-c", "ls -A"))
    assert ended.exit.exit_code == 0 and slot.log() == ""  # an empty cwd


def test_warm_tasks_run_in_one_process_with_values_inline(slot: Slot) -> None:
    pids = set()
    for i in range(20):
        started, ended = slot.run(task("add", i, b=1))
        assert ended.exit.outcome() == ("succeeded", ""), ended
        assert json.loads(ended.result or b"") == {"value": i + 1}
        pids.add(started.pid)
    assert len(pids) == 1
    _, ended = slot.run(task("say", "hello"))
    assert slot.log() == "hello\n" and json.loads(ended.result or b"") == {"value": "hello"}


def test_a_raised_exception_gives_its_classes_and_the_process_serves_on(slot: Slot) -> None:
    s1, ended = slot.run(task("boom"))
    assert ended.exit.outcome()[0] == "failed" and ended.result is None
    assert ended.exit.error[:3] == ("tests.helpers.slot_tasks.Flaky", "builtins.ConnectionError", "builtins.OSError")
    assert "Flaky: no route" in slot.log()  # its traceback in its log
    s2, ended = slot.run(task("pid"))
    assert ended.exit.exit_code == 0 and s2.pid == s1.pid


def test_an_unimportable_module_is_one_line_of_reason(slot: Slot) -> None:
    req = task("noop")._replace(task="no_such_module_here:fn", worker="w1")
    _, ended = slot.run(req)
    assert ended.exit.outcome()[0] == "failed"
    assert ended.exit.reason.startswith("task module 'no_such_module_here' cannot be imported on worker w1")
    assert slot.run(task("noop"))[1].exit.exit_code == 0


def test_a_value_over_the_inline_cap_is_left_in_a_named_file(slot: Slot) -> None:
    _, ended = slot.run(task("big", INLINE_MAX_BYTES + 10))
    assert ended.exit.exit_code == 0 and ended.result is None and ended.result_file
    assert json.loads(Path(ended.result_file).read_bytes()) == {"value": "x" * (INLINE_MAX_BYTES + 10)}
    _, ended = slot.run(task("big", 10))
    assert ended.result is not None and not os.path.exists(str(slot.dir.result_file("json")))  # emptied at start


def test_warm_max_tasks_and_warm_max_rss_retire_the_process(slot: Slot) -> None:
    pids = [slot.run(task("pid", warm=3))[0].pid for _ in range(7)]
    assert pids[0] == pids[1] == pids[2] != pids[3] == pids[4] == pids[5] != pids[6]
    grown = slot.run(task("grow", 64, warm=1000, warm_max_rss_mb=40))[0].pid
    assert slot.run(task("pid", warm=1000, warm_max_rss_mb=40))[0].pid != grown


def test_a_fresh_fork_per_task_when_warm_max_tasks_is_0(slot: Slot) -> None:
    pids = set()
    for _ in range(3):
        _, ended = slot.run(task("pid", warm=0))
        assert ended.exit.exit_code == 0
        pids.add(json.loads(ended.result or b"")["value"])
    assert len(pids) == 3


def test_a_process_job_between_two_tasks_and_the_next_task_in_a_fresh_process(slot: Slot) -> None:
    first = slot.run(task("pid"))[0].pid
    assert slot.run(process("sh", "-c", "echo between"))[1].exit.exit_code == 0
    assert slot.log() == "between\n"
    started, ended = slot.run(task("pid"))
    assert ended.exit.exit_code == 0 and started.pid != first


def test_a_second_supervisor_on_the_slot_exits_at_once(slot: Slot) -> None:
    second = subprocess.run(
        [sys.executable, "-m", "piloop_worker.slots.supervisor", str(slot.dir.root)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert second.returncode == 0 and "event=slot.supervisor_exists" in second.stderr
    assert slot.run(process("true"))[1].exit.exit_code == 0  # the first runs on


def test_a_malformed_datagram_is_ignored_and_logged(slot: Slot) -> None:
    slot.handle.close()
    raw = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    dirfd = os.open(slot.dir.root, os.O_PATH)
    try:
        raw.connect(f"/proc/self/fd/{dirfd}/sock")
        raw.send(b"{not json")
        raw.send(b'{"t": "launch"}')
        raw.send(encode(Hello()))
        raw.settimeout(30)
        assert isinstance(parse(raw.recv(1 << 20)), State)
    finally:
        raw.close()
        os.close(dirfd)
    wait_for(lambda: "unknown message type 'launch'" in slot.supervisor_log(), what="the bad datagram logged")
    assert "event=slot.bad_message" in slot.supervisor_log() and "not JSON" in slot.supervisor_log()


def test_metrics_of_a_job_past_its_first_second_and_none_left_for_the_next(slot: Slot) -> None:
    slot.run(process("sleep", "1.6", metrics_seconds=0.2))
    lines = slot.dir.metrics.read_text().splitlines()
    assert lines and all("cpu_percent" in json.loads(x) for x in lines)
    slot.run(process("true"))
    assert slot.dir.metrics.read_text() == ""


def test_a_job_over_its_cgroups_limit_is_out_of_memory_and_the_next_has_its_own_count(slot: Slot, job_cgroups) -> None:
    cg = job_cgroups.take(64)
    grant = CgroupGrant(str(cg.path), cg.version, 64)
    hog = "b = bytearray(256 << 20); b[::4096] = b'x' * len(b[::4096])"
    _, ended = slot.run(process(sys.executable, "-c", hog, cgroup=grant))
    assert ended.exit.oom and ended.exit.outcome() == ("failed", "out of memory"), ended
    _, ended = slot.run(process("true", cgroup=grant))
    assert not ended.exit.oom and ended.exit.exit_code == 0
    started, ended = slot.run(task("grow", 16, cgroup=grant))  # a warm task joins the group for its task
    assert ended.exit.exit_code == 0 and not ended.exit.oom
    assert started.pid not in cg.pids()  # and leaves it after


def test_bye_lets_the_supervisor_exit_once_idle_and_the_next_open_starts_another(slot: Slot) -> None:
    first = slot.handle.pid
    slot.handle.bye()
    slot.handle.close()
    wait_for(lambda: not alive(first), what="the supervisor to exit after bye")
    slot.open()
    assert slot.handle.pid != first and slot.run(process("true"))[1].exit.exit_code == 0


def test_a_supervisor_no_worker_connects_to_exits_after_its_idle_time(tmp_path: Path) -> None:
    root = tmp_path / "slots" / "0"
    code = "import sys; from piloop_worker.slots import supervisor as s; s.IDLE_EXIT_SECONDS = 0.5; sys.exit(s.main())"
    done = subprocess.run(
        [sys.executable, "-c", code, str(root)], capture_output=True, text=True, cwd=ROOT, timeout=scaled(60)
    )
    assert done.returncode == 0 and "event=slot.supervisor_exited" in done.stderr
    assert not (root / "sock").exists()


def test_a_supervisor_that_cannot_start_is_named_when_the_wait_ends(tmp_path: Path) -> None:
    h = SlotHandle(SlotDir(tmp_path / "slots" / "0"), python="/bin/false")
    with pytest.raises(
        Unavailable, match=r"no supervisor answered in 2s \(waited for a supervisor: the one it started"
    ):
        h.open(timeout=2)
    h.close()


THRASH = """
with open('big.bin', 'wb') as f:
    for _ in range(96):
        f.write(b'\\1' * (1 << 20))
while True:
    with open('big.bin', 'rb') as f:
        while f.read(1 << 20):
            pass
"""


def test_a_job_held_at_its_memory_limit_is_stopped_after_its_held_time(slot: Slot, job_cgroups) -> None:
    cg = job_cgroups.take(48)
    grant = CgroupGrant(str(cg.path), cg.version, 48, 1.5)
    _, ended = slot.run(process(sys.executable, "-c", THRASH, cgroup=grant, kill_grace=1.0), timeout=60)
    # stopped by the supervisor (SIGTERM), not killed by the kernel
    assert ended.exit.outcome() == ("failed", "out of memory (held at its limit for 1.5s)"), ended
    assert ended.exit.oom and ended.exit.signal == signal.SIGTERM and ended.exit.stopped == "memory_held"
