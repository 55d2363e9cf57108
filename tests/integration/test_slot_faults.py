"""The slot supervisor under faults, with real processes: fencing by the slot's record (never renewed, renewed, long
past), the supervisor or the "worker" SIGKILLed, a restarted handle adopting the slot's job and its end, and tasks
and process jobs that misbehave (docs/worker.md, "Slots")."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from piloop_worker import clock
from piloop_worker.jobuser import JobUser
from piloop_worker.records import StopReason
from piloop_worker.slots.handle import Gone
from piloop_worker.slots.job import LATE
from piloop_worker.slots.wire import Ended, Started
from tests.helpers.redis import wait_for
from tests.helpers.slots import ROOT, Slot, alive, group_alive, process, task
from tests.helpers.slowdown import scaled
from tests.helpers.users import system_user

IGNORES_TERM = ("sh", "-c", "trap '' TERM; echo ready; sleep 60; echo never")


@pytest.fixture
def slot(tmp_path: Path) -> Iterator[Slot]:
    s = Slot(tmp_path / "slots" / "0")
    s.open()
    yield s
    s.kill()


def test_a_deadline_never_renewed_fences_the_job_at_it(slot: Slot) -> None:
    _, ended = slot.run(process("sleep", "60"), deadline_in=1.0)
    assert ended.exit.stopped is StopReason.FENCED and ended.exit.outcome()[0] == "fenced"
    assert ended.exit.signal == signal.SIGTERM and 1.0 <= ended.exit.duration_seconds < scaled(10)


def test_a_job_that_ignores_sigterm_is_killed_after_its_grace(slot: Slot) -> None:
    _, ended = slot.run(process(*IGNORES_TERM, kill_grace=1.0), deadline_in=1.0)
    assert ended.exit.stopped is StopReason.FENCED and ended.exit.signal == signal.SIGKILL
    assert ended.exit.duration_seconds >= 2.0  # the deadline, then the whole grace
    assert "never" not in slot.log()
    assert slot.run(process("true"))[1].exit.exit_code == 0  # the slot runs the next job


def test_a_deadline_renewed_through_the_record_lets_the_job_run_on(slot: Slot) -> None:
    ahead = scaled(1.0)  # each renewal a second ahead (more on a loaded machine), the job's life 2.5 of them
    g = slot.start(process("sleep", str(2.5 * ahead)), deadline_in=ahead)
    end = time.monotonic() + scaled(20)
    ended = None
    while ended is None and time.monotonic() < end:
        slot.handle.write_deadline(g, clock.now() + ahead)
        slot.pending.extend(slot.handle.read(timeout=0.1))
        ended = next((m for m in slot.pending if isinstance(m, Ended)), None)
    assert ended is not None and ended.exit.outcome() == ("succeeded", ""), ended
    assert ended.exit.duration_seconds >= 2.5 * ahead


def test_a_deadline_written_for_another_generation_does_not_renew_this_job(slot: Slot) -> None:
    g = slot.start(process("sleep", "60"), deadline_in=1.0)
    slot.handle.write_deadline(g + 1, clock.now() + 60)  # the next job's: not this one's
    ended = slot.wait(Ended, g)
    assert ended.exit.stopped is StopReason.FENCED


def test_a_deadline_long_past_kills_at_once_without_grace(slot: Slot) -> None:
    _, ended = slot.run(process(*IGNORES_TERM, kill_grace=30.0), deadline_in=-(LATE + 5))
    assert ended.exit.stopped is StopReason.FENCED and ended.exit.signal == signal.SIGKILL
    assert ended.exit.duration_seconds < scaled(5)  # not the 30 s grace


def test_a_stop_ends_the_job_with_its_reason(slot: Slot) -> None:
    g = slot.start(process("sleep", "60", kill_grace=0.5))
    slot.wait(Started, g)
    slot.handle.stop(g, StopReason.CANCELLED)
    ended = slot.wait(Ended, g)
    slot.handle.ack(g)
    assert ended.exit.outcome() == ("cancelled", "cancelled")


def test_the_jobs_timeout(slot: Slot) -> None:
    _, ended = slot.run(process("sleep", "60", timeout=0.5, kill_grace=0.5))
    assert ended.exit.outcome() == ("failed", "timeout")


def test_sigkill_of_the_supervisor_kills_its_job_at_once(slot: Slot) -> None:
    g = slot.start(process("sh", "-c", "sleep 60 & exec sleep 61"))  # a leader, and a child of its in its group
    job = slot.wait(Started, g).pid
    os.kill(slot.handle.pid, signal.SIGKILL)
    wait_for(lambda: not alive(job), timeout=2, what="the job's leader to die with its supervisor")
    ended = slot.wait(Ended, g)
    assert ended.exit.outcome() == ("lost", "the slot's supervisor died before the job ended")
    slot.wait(Gone)
    wait_for(lambda: not group_alive(job), timeout=2, what="the rest of its group killed by the handle")
    slot.open()  # a new supervisor for the slot
    assert slot.run(process("true"))[1].exit.exit_code == 0


def test_sigkill_of_the_supervisor_kills_a_warm_task_at_once(slot: Slot) -> None:
    g = slot.start(task("hang"))
    job = slot.wait(Started, g).pid
    os.kill(slot.handle.pid, signal.SIGKILL)
    wait_for(lambda: not alive(job), timeout=2, what="the task's process to die with its supervisor")
    assert slot.wait(Ended, g).exit.lost


def _worker(s: Slot, generation: int, seconds: float, *argv: str) -> tuple[subprocess.Popen[str], int]:
    """A stand-in worker holding the slot, its job started; the job's pid."""
    p = subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.slotworker", str(s.dir.root), str(generation), str(seconds), *argv],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert p.stdout is not None
    line = p.stdout.readline()
    assert line.startswith("started "), line
    return p, int(line.split()[1])


def test_a_killed_worker_leaves_its_job_to_the_supervisor_and_a_new_handle_adopts_it(slot: Slot) -> None:
    slot.handle.close()
    worker, job = _worker(slot, 7, scaled(4), "sleep", "60")
    worker.kill()
    worker.wait()
    time.sleep(0.5)
    assert alive(job)  # the supervisor keeps it
    state = slot.open()
    assert state.holding is not None and (state.holding.generation, state.holding.pid) == (7, job)
    ended = slot.wait(Ended, 7, timeout=30)  # fenced at the deadline the dead worker gave it
    assert ended.exit.stopped is StopReason.FENCED and not alive(job)
    slot.handle.ack(7)
    slot.generation = 7
    assert slot.run(process("true"))[1].exit.exit_code == 0


def test_an_end_with_no_worker_connected_waits_in_ended_json_until_acked(slot: Slot) -> None:
    slot.handle.close()
    worker, _ = _worker(slot, 3, 60, "sh", "-c", "sleep 0.5; exit 4")
    worker.kill()
    worker.wait()
    wait_for(slot.dir.ended.exists, timeout=20, what="ended.json")
    state = slot.open()
    assert state.holding is None and [e.generation for e in state.ended] == [3]
    assert state.ended[0].exit.outcome() == ("failed", "exit code 4")
    slot.handle.ack(3)
    wait_for(lambda: not slot.dir.ended.exists(), what="ended.json removed at the ack")
    again = slot.open()
    assert again.ended == []


def test_a_supervisor_that_lost_its_worker_and_ended_is_found_again_from_ended_json(slot: Slot) -> None:
    slot.handle.close()
    worker, _ = _worker(slot, 5, 60, "true")
    worker.kill()
    worker.wait()
    wait_for(slot.dir.ended.exists, timeout=20, what="ended.json")
    for pid in slot.pids | {slot.handle.pid}:
        os.kill(pid, signal.SIGTERM)  # the supervisor goes; its record of the end stays
    wait_for(lambda: not slot.dir.sock.exists(), what="the supervisor to exit")
    state = slot.open()  # a new supervisor reads the end back
    assert [e.generation for e in state.ended] == [5] and state.ended[0].exit.exit_code == 0


def test_sigterm_to_the_supervisor_stops_its_job_and_reports_it(slot: Slot) -> None:
    g = slot.start(process("sleep", "60", kill_grace=0.5))
    slot.wait(Started, g)
    os.kill(slot.handle.pid, signal.SIGTERM)
    ended = slot.wait(Ended, g)
    assert ended.exit.outcome() == ("lost", "the slot's supervisor was terminated")


def test_a_hanging_task_is_stopped_and_the_slot_runs_the_next(slot: Slot) -> None:
    g = slot.start(task("hang", kill_grace=0.5))
    hung = slot.wait(Started, g).pid
    slot.handle.stop(g, StopReason.CANCELLED)
    ended = slot.wait(Ended, g)
    slot.handle.ack(g)
    assert ended.exit.outcome() == ("cancelled", "cancelled") and not alive(hung)
    started, ended = slot.run(task("pid"))
    assert ended.exit.exit_code == 0 and started.pid != hung


def test_what_a_task_leaves_behind_is_killed_when_it_ends(slot: Slot, tmp_path: Path) -> None:
    where = tmp_path / "sleeper"
    started, ended = slot.run(task("leave_a_sleeper", str(where)))
    assert ended.exit.exit_code == 0
    sleeper = int(where.read_text())
    wait_for(lambda: not alive(sleeper), timeout=5, what="the task's leftover to be killed")
    assert slot.run(task("pid"))[0].pid == started.pid  # the warm process itself stays


def test_a_task_that_closes_its_stdout_and_the_next_one_still_logs(slot: Slot) -> None:
    assert slot.run(task("close_stdout"))[1].exit.exit_code == 0
    _, ended = slot.run(task("say", "still here"))
    assert ended.exit.exit_code == 0 and slot.log() == "still here\n"


def test_a_task_that_calls_os_exit_ends_with_its_status_and_the_next_gets_a_fresh_process(slot: Slot) -> None:
    first, ended = slot.run(task("exit_now", 3))
    assert ended.exit.outcome() == ("failed", "exit code 3") and not ended.exit.lost
    first0, ended = slot.run(task("exit_now", 0))
    assert ended.exit.exit_code == 0
    started, ended = slot.run(task("pid"))
    assert ended.exit.exit_code == 0 and started.pid not in (first.pid, first0.pid)


def test_a_warm_process_killed_from_outside_under_its_task_is_lost_not_failed(slot: Slot) -> None:
    g = slot.start(task("hang"))
    pid = slot.wait(Started, g).pid
    os.kill(pid, signal.SIGKILL)
    ended = slot.wait(Ended, g)
    slot.handle.ack(g)
    assert ended.exit.outcome() == ("lost", "its warm task process was killed by SIGKILL from outside")
    assert slot.run(task("pid"))[1].exit.exit_code == 0


def test_a_frozen_supervisor_woken_past_the_deadline_kills_at_once_without_grace(slot: Slot) -> None:
    g = slot.start(process(*IGNORES_TERM, kill_grace=300.0), deadline_in=1.0)
    slot.wait(Started, g)
    os.kill(slot.handle.pid, signal.SIGSTOP)  # the host frozen, as far as the supervisor can tell
    try:
        time.sleep(1.0 + LATE + 1.0)  # the freeze itself: past the deadline by more than LATE
    finally:
        os.kill(slot.handle.pid, signal.SIGCONT)
    ended = slot.wait(Ended, g)
    assert ended.exit.stopped is StopReason.FENCED and ended.exit.signal == signal.SIGKILL
    assert ended.exit.duration_seconds < scaled(30)  # not the 300 s grace


@pytest.fixture
def user_slot() -> Iterator[tuple[Slot, int]]:
    """A slot a job of another user can reach its cwd in (every dir above it passable), and that user's uid."""
    if os.geteuid() != 0:
        pytest.skip("only root runs a job as another user")
    u = system_user("piloop-slot")
    top = Path(tempfile.mkdtemp(prefix="piloop-slot-"))
    top.chmod(0o711)
    s = Slot(top / "slots" / "0")
    s.open()
    yield s, u.pw_uid
    s.kill()
    shutil.rmtree(top, ignore_errors=True)


def test_a_job_as_another_user_and_a_task_as_one_in_a_fresh_process(user_slot: tuple[Slot, int]) -> None:
    slot, uid = user_slot
    pw = pwd.getpwuid(uid)
    user = JobUser(pw.pw_name, uid, pw.pw_gid, (pw.pw_gid,)).wire()
    _, ended = slot.run(process("sh", "-c", "id -u; touch mine", user=user))
    assert ended.exit.exit_code == 0 and slot.log() == f"{uid}\n"
    assert (slot.dir.work / "mine").stat().st_uid == uid
    warm = slot.run(task("pid"))[0].pid
    pids = {slot.run(task("pid", user=user))[0].pid for _ in range(2)}
    assert warm not in pids and len(pids) == 2  # never the warm process, a fresh one each
