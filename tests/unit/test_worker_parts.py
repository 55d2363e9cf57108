"""The worker's parts that need no process: PSI, host samples, admission, job dirs, the spool, logs, outcomes, the claim
a round's reports carry."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from piloop_common.cas.local import LocalStore
from piloop_common.host.sample import Sampler, memory_pressure, parse_psi, sample
from piloop_common.protocol.report import ReportAnswer, ReportRequest, ReportsResponse
from piloop_common.protocol.worker import PROTOCOL, ClaimResponse, HostSample, Timing
from piloop_worker import spool as spool_module
from piloop_worker.cgroups import Cgroups
from piloop_worker.claiming import EVALUATIONS_PER_CLAIM, Claimer
from piloop_worker.context import WorkerContext
from piloop_worker.held import Held
from piloop_worker.holdings import Holdings
from piloop_worker.jobfiles import files_under
from piloop_worker.lease import HeldLease, report_id_for
from piloop_worker.logs import LogShipper
from piloop_worker.pressure import admission
from piloop_worker.reachability import Reachability
from piloop_worker.records import ExitRecord, StopReason
from piloop_worker.relay import Relay
from piloop_worker.reporting import Reporter
from piloop_worker.repos import Repos
from piloop_worker.slotset import Slots
from piloop_worker.spool import DURABLE_AFTER_SECONDS, Spool

PSI = "some avg10=12.50 avg60=3.00 avg300=0.75 total=123456\nfull avg10=1.25 avg60=0.00 avg300=0.00 total=99\n"


def test_psi_parsing(tmp_path: Path) -> None:
    got = parse_psi(PSI)
    assert got["some"] == {"avg10": 12.5, "avg60": 3.0, "avg300": 0.75, "total": 123456.0}
    assert got["full"]["avg10"] == 1.25
    f = tmp_path / "memory"
    f.write_text(PSI)
    assert memory_pressure(f) == 12.5
    assert memory_pressure(tmp_path / "absent") is None  # a kernel without PSI
    f.write_text("garbage\n")
    assert memory_pressure(f) is None


def test_host_sample_fields(tmp_path: Path) -> None:
    psi = tmp_path / "memory"
    psi.write_text(PSI)
    s = sample(tmp_path / "not" / "yet" / "made", psi)  # the disk of the nearest existing parent
    assert s.cpus >= 1 and s.load1 >= 0 and s.memory_available_gb > 0 and s.disk_free_gb > 0
    assert s.memory_pressure == 12.5
    assert HostSample.model_validate(s.model_dump()) == s


def test_sampler_answers_from_its_cache_without_waiting(tmp_path: Path) -> None:
    sm = Sampler(tmp_path, max_age=0.0, timeout=5.0)
    first = sm.get()
    assert first.cpus >= 1
    t0 = time.monotonic()
    for _ in range(50):
        sm.get()  # stale at once: each call starts at most one refresh and returns the cached sample
    assert time.monotonic() - t0 < 1.0


def test_memory_pressure_admission() -> None:
    base = dict(cpus=2, load1=0.1, memory_available_gb=8, disk_free_gb=10)
    assert admission(HostSample(**base, memory_pressure=None), 10) == ""
    assert admission(HostSample(**base, memory_pressure=9.9), 10) == ""
    assert admission(HostSample(**base, memory_pressure=10.1), 10) == "memory"


def _report(job: str = "j1") -> ReportRequest:
    return ReportRequest(
        protocol=PROTOCOL, report_id=report_id_for(job, "5"), job=job, token="5", outcome="succeeded", exit_code=0
    )


def test_the_spool_keeps_only_the_newest_reports_it_set_aside(tmp_path: Path, monkeypatch, caplog) -> None:
    monkeypatch.setattr(spool_module, "BAD_KEPT", 3)
    sp = Spool(tmp_path / "spool")
    for i in range(5):
        r = _report(f"j{i}")
        os.utime(sp.write(r), (1000 + i, 1000 + i))  # oldest first, apart by a second
        sp.set_aside(r.report_id)
    (tmp_path / "spool" / "junk.json").write_text("not a report")  # set aside by pending, newest of all
    assert sp.pending() == []
    kept = sorted(p.name for p in (tmp_path / "spool").glob("*.bad"))
    assert kept == sorted(["junk.bad", f"{report_id_for('j4', '5')}.bad", f"{report_id_for('j3', '5')}.bad"])
    assert caplog.text.count("event=spool.bad_removed") == 3


def test_spool_write_pending_remove(tmp_path: Path) -> None:
    sp = Spool(tmp_path / "spool" / "w1")
    a, b = _report("a"), _report("b")
    sp.write(a)
    time.sleep(0.01)  # distinct mtimes: oldest first
    sp.write(b)
    (sp.root / "junk.json").write_text("{not json")
    assert [r.job for r in Spool(sp.root).pending()] == ["a", "b"]  # a new Spool: it is all on disk
    assert (sp.root / "junk.bad").exists()  # set aside, never sent, never lost
    sp.write(a)  # the same report again is the same file
    sp.remove(a.report_id)
    sp.remove(a.report_id)
    assert [r.job for r in sp.pending()] == ["b"]
    assert sp.pending()[0] == b


def test_spool_fsyncs_only_the_reports_of_jobs_that_ran_a_second(tmp_path: Path, monkeypatch) -> None:
    synced: list[str] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), real(fd))[1])
    sp = Spool(tmp_path / "spool" / "w1")
    sp.write(_report("short").model_copy(update={"duration_seconds": 0.2}))
    assert synced == []  # run again after a crash of the machine costs less than an fsync each
    sp.write(_report("long").model_copy(update={"duration_seconds": DURABLE_AFTER_SECONDS}))
    assert len(synced) == 1 and ".json" in synced[0]  # the temp file, before its rename
    assert sorted(r.job for r in sp.pending()) == ["long", "short"]


def test_report_id_is_one_per_lease() -> None:
    assert report_id_for("j1", "5") == report_id_for("j1", "5")
    assert report_id_for("j1", "5") != report_id_for("j1", "6")


@pytest.mark.parametrize(
    "rec,want",
    [
        (ExitRecord(exit_code=0), ("succeeded", "")),
        (ExitRecord(exit_code=2), ("failed", "exit code 2")),
        (ExitRecord(signal=9), ("failed", "killed by signal 9")),
        (ExitRecord(signal=9, oom=True), ("failed", "out of memory")),
        (ExitRecord(signal=15, stopped=StopReason.TIMEOUT), ("failed", "timeout")),
        (
            ExitRecord(signal=15, stopped=StopReason.FENCED),
            ("fenced", "the worker could not renew the lease before its deadline"),
        ),
        (ExitRecord(signal=15, stopped=StopReason.CANCELLED), ("cancelled", "cancelled")),
        (ExitRecord(signal=15, stopped=StopReason.LOST), ("lost", "the server says the lease is lost")),
        (ExitRecord(signal=15, stopped=StopReason.LEASE_LOST), ("lost", "the server says the lease is lost")),
        (ExitRecord(signal=15, stopped=StopReason.REFUSED), ("lost", "the server refused the worker")),
        (ExitRecord(signal=15, stopped=StopReason.SHIM_TERMINATED), ("lost", "the job's shim was terminated")),
        (ExitRecord(exit_code=127, reason="cannot start 'nope'"), ("failed", "cannot start 'nope'")),
        (ExitRecord(lost=True, reason="the job's shim died"), ("lost", "the job's shim died")),
    ],
)
def test_outcomes(rec: ExitRecord, want: tuple[str, str]) -> None:
    assert rec.outcome() == want
    assert ExitRecord.parse(rec.wire()) == rec  # and it crosses the disk whole


def test_an_exit_record_crosses_the_wire_whole_and_ignores_what_it_does_not_know() -> None:
    rec = ExitRecord(exit_code=3, stopped=StopReason.TIMEOUT, reason="timeout", error=("a.B",))
    assert ExitRecord.parse(rec.wire()) == rec
    # a record written by another release: an unknown stop reason reads as a stop, an unknown field is ignored
    old = ExitRecord.parse(b'{"exit_code": null, "signal": 15, "stopped": "halted", "colour": "red"}')
    assert old.stopped is StopReason.STOPPED and old.outcome() == ("failed", "killed by signal 15")


def test_log_shipper_sends_new_bytes_once_and_survives_a_restart(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "cas")
    output_log, state = tmp_path / "output.log", tmp_path / "log.json"
    sh = LogShipper(output_log, state)
    assert not sh.due(0.0)
    output_log.write_bytes(b"one\n")
    assert not sh.due(100.0)  # just written: it goes a few seconds later, in one chunk with what follows
    assert sh.due(103.0)
    new = sh.upload(store)
    assert [store.get_bytes(a) for a in new] == [b"one\n"]
    sh.mark_posted(len(new))
    assert not sh.due(200.0)
    with open(output_log, "ab") as f:
        f.write(b"two\n")
    again = LogShipper(output_log, state, resume=True)  # a restarted worker picks up where the last one stopped
    assert again.offset == 4 and again.chunks == new
    assert again.due(300.0) is False and again.due(303.0) is True
    assert [store.get_bytes(a) for a in again.upload(store)] == [b"two\n"]
    assert len(again.chunks) == 2
    assert LogShipper(output_log, state).offset == 0 and not state.exists()  # a new job's log starts again


def _run(tmp_path: Path, **kw):
    from piloop_worker.main import run_worker

    args = dict(
        server="http://127.0.0.1:9",
        socket=None,
        pool="gpu",
        token="plt_x",
        token_file=None,
        name=None,
        image="",
        dir=None,
        home=tmp_path,
    )
    args.update(kw)
    return run_worker(**args)


def test_a_worker_refuses_to_hold_state_credentials(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("PILOOP_REDIS_URL", "redis://127.0.0.1:6379/0")
    assert _run(tmp_path) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "PILOOP_REDIS_URL is set: a worker holds no state credentials" in err
    monkeypatch.delenv("PILOOP_REDIS_URL")
    (tmp_path / "config.toml").write_text('[plugins.state]\nurl = "redis://127.0.0.1:6379/0"\n')
    assert _run(tmp_path) == 2
    assert "has [plugins.state] url: a worker holds no state credentials" in capsys.readouterr().err


@pytest.mark.parametrize(
    "kw,config,says",
    [
        ({"token": None}, "", "no token: set PILOOP_HTTPS_TOKEN or --token-file"),
        ({"server": None}, "", "give --server URL"),
        ({}, "[plugins.executor]\nrenew_seconds = 'often'\n", "config: "),
    ],
)
def test_user_mistakes_are_one_line_and_exit_2(tmp_path: Path, capsys, monkeypatch, kw, config, says) -> None:
    monkeypatch.delenv("PILOOP_REDIS_URL", raising=False)
    (tmp_path / "config.toml").write_text(config)
    assert _run(tmp_path, **kw) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1 and "Traceback" not in err


def test_fence_deadline_is_two_heartbeats_before_expiry_and_leaves_room_for_the_kill() -> None:
    from piloop_common.protocol.worker import Timing
    from piloop_worker.fencing import fence_deadline

    t = Timing(
        renew_seconds=0.5,
        grace_seconds=2,
        toleration_seconds=6,
        request_timeout_seconds=1,
        kill_grace_seconds=0.5,
        memory_pressure_max=50,
    )
    assert fence_deadline(100.0, t) == 105.0
    slow_kill = t.model_copy(update={"kill_grace_seconds": 3.0})
    assert fence_deadline(100.0, slow_kill) + 3.0 < 106.0  # SIGKILL still lands before the lease expires


def test_a_jobs_output_files_are_listed_as_rglob_listed_them(tmp_path: Path) -> None:
    out = tmp_path / "outputs"
    (out / "b" / "c").mkdir(parents=True)
    (out / "b-").mkdir()
    for rel in ("z.json", ".hidden", "b/x", "b/c/deep.txt", "b-/y", "a b.txt"):
        (out / rel).write_text(rel)
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "inside").mkdir(parents=True)
    (elsewhere / "inside" / "f").write_text("not the job's")
    (elsewhere / "file").write_text("linked")
    (out / "link-to-file").symlink_to(elsewhere / "file")
    (out / "link-to-dir").symlink_to(elsewhere / "inside")  # not entered, as rglob does not
    (out / "dangling").symlink_to(tmp_path / "nothing")
    os.mkfifo(out / "fifo")
    want = [(p.relative_to(out).as_posix(), str(p)) for p in sorted(out.rglob("*")) if p.is_file()]
    got = files_under(out)
    assert got == want
    assert [name for name, _ in got] == [".hidden", "a b.txt", "b/c/deep.txt", "b/x", "b-/y", "link-to-file", "z.json"]
    assert files_under(tmp_path / "missing") == [] and files_under(elsewhere / "file") == []


class _Api:
    """The worker's API client, answering every report `accepted` and every claim with nothing; it keeps each call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    def call(self, method, path, body=None, model=None, timeout=None):
        self.calls.append((path, body))
        answers = [ReportAnswer(answer="accepted", state="succeeded") for _ in body.reports]
        return ReportsResponse(answers=answers, claim=ClaimResponse(reason="nothing"))

    def close(self) -> None:
        pass


def _never_started(*args: object) -> None:
    raise AssertionError("the claim's answer leased nothing to start")


@pytest.fixture
def busy_worker(tmp_path: Path):
    """A worker's reporting part without its processes: `held` jobs that have ended, each with its report spooled.
    No supervisors, no cgroups, no server: only what sending reports touches."""
    made: list[Relay] = []

    def make(held: int) -> tuple[Reporter, Holdings, _Api, list[Held]]:
        ctx = WorkerContext("w1", Reachability("test"))
        ctx.timing = Timing(
            renew_seconds=10,
            grace_seconds=30,
            toleration_seconds=60,
            request_timeout_seconds=5,
            kill_grace_seconds=5,
            memory_pressure_max=10,
        )
        api, holdings = _Api(), Holdings()
        store = LocalStore(tmp_path / "cas")  # a report flushes its store first: nothing held here
        sample = HostSample(cpus=2, load1=0.1, memory_available_gb=8, disk_free_gb=10)
        claimer = Claimer(ctx, api=api, holdings=holdings, sample=lambda: sample, start=_never_started)
        made.append(relay := Relay(lambda: api, 5.0))
        reporter = Reporter(
            ctx,
            api=api,
            holdings=holdings,
            slots=Slots(tmp_path),
            claimer=claimer,
            store=store,
            spool=Spool(tmp_path / "spool"),
            repos=Repos(tmp_path / "repos", store),
            cgroups=Cgroups("test", root=tmp_path / "no-cgroups"),
            relay=relay,
        )
        ready = []
        for i in range(held):
            shipper = LogShipper(tmp_path / f"output{i}.log", tmp_path / f"log{i}.json")
            h = Held(HeldLease(f"j{i}", "5"), "evaluation", i, i + 1, shipper, report=_report(f"j{i}"), spooled=True)
            reporter.spool.write(h.report)
            holdings.add(h)
            ready.append(h)
        return reporter, holdings, api, ready

    yield make
    for relay in made:
        relay.close()


@pytest.mark.parametrize("ended, asked", [(1, EVALUATIONS_PER_CLAIM), (2, EVALUATIONS_PER_CLAIM), (7, 7)])
def test_the_reports_of_a_round_carry_a_claim_for_every_slot_they_free(busy_worker, ended: int, asked: int) -> None:
    """A busy worker's round is one call: its ended jobs' reports, and a claim for as many jobs as they free (at least
    the usual few), so no slot they free waits for a claim of its own."""
    reporter, holdings, api, ready = busy_worker(ended)
    reporter.send_all(ready)
    ((path, body),) = api.calls
    assert path == "/v1/worker/reports" and [r.job for r in body.reports] == [h.job for h in ready]
    assert body.claim is not None and body.claim.want["evaluation"] == asked and body.claim.wait_seconds == 0
    assert not holdings and reporter.spool.pending() == []  # each answered: its job let go, its spooled report gone
