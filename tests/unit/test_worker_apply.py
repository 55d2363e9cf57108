"""The heartbeat's answer acts only on jobs the worker still holds: a job reported while the answer was on its way
(the server then answers `lost`, and the job's dir may already be a spare for a later job) is left alone."""

from __future__ import annotations

from pathlib import Path

from piloop_common.protocol.worker import HeartbeatResponse, LeaseStatus, Timing
from piloop_worker.fencing import apply_answer
from piloop_worker.held import Held
from piloop_worker.holdings import Holdings
from piloop_worker.jobdir import JobDir
from piloop_worker.lease import HeldLease
from piloop_worker.logs import LogShipper

TIMING = Timing(
    renew_seconds=1,
    grace_seconds=3,
    toleration_seconds=9,
    request_timeout_seconds=1,
    kill_grace_seconds=0.5,
    memory_pressure_max=0.9,
)


def _held(root: Path, job: str) -> Held:
    jd = JobDir(root / job)
    jd.root.mkdir(parents=True)
    return Held(HeldLease(job, "1000000000001.ab"), "evaluation", jd, LogShipper(jd))


def _holding(*held: Held) -> Holdings:
    out = Holdings()
    for h in held:
        out.add(h)
    return out


def test_a_lost_answer_for_a_job_reported_meanwhile_writes_nothing_and_a_held_one_is_stopped(tmp_path):
    kept, reported = _held(tmp_path, "j1"), _held(tmp_path, "j2")
    apply_answer(_holding(kept), {"j1": LeaseStatus.LOST, "j2": LeaseStatus.LOST}, 0.0, [kept, reported], TIMING, "w1")
    assert kept.jd.stop_reason() is not None
    assert reported.jd.stop_reason() is None and not any(reported.jd.root.iterdir())


def test_a_held_job_named_ok_gets_its_deadline(tmp_path):
    kept = _held(tmp_path, "j1")
    apply_answer(_holding(kept), {"j1": LeaseStatus.OK}, 100.0, [kept], TIMING, "w1")
    assert kept.jd.read_deadline() is not None and kept.jd.stop_reason() is None


def test_the_servers_word_is_parsed_once_and_a_word_this_worker_does_not_know_is_lost() -> None:
    answer = HeartbeatResponse.model_validate({"jobs": {"a": "ok", "b": "cancel", "c": "lost", "d": "paused"}})
    assert answer.jobs == {"a": LeaseStatus.OK, "b": LeaseStatus.CANCEL, "c": LeaseStatus.LOST, "d": LeaseStatus.LOST}
    assert HeartbeatResponse(jobs={"a": "ok"}).model_dump(mode="json")["jobs"] == {"a": "ok"}  # the server's side


def test_a_held_lease_names_its_report_and_its_dir_by_the_pair(tmp_path: Path) -> None:
    lease = HeldLease("j1", "1000000000001.ab")
    assert (
        lease.report_id
        == HeldLease("j1", "1000000000001.ab").report_id
        != HeldLease("j1", "1000000000002.ab").report_id
    )
    assert JobDir.for_lease(tmp_path, *lease).root.name == lease.name == "j1.1000000000001"
