"""`piloop worker check`'s verdict on a worker's own record (`piloop_common/host/health.py`): fresh, stale, its
process gone, no record (tests/integration/test_worker_check.py has a real worker write it)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from piloop_common.host import health
from piloop_common.host.health import WorkerHealth


def record(d: Path, acked_at: float, pid: int | None = None) -> None:
    health.write(d, WorkerHealth(worker="w1", pid=pid or os.getpid(), acked_at=acked_at, grace_seconds=50))


def test_a_fresh_heartbeat_is_healthy(tmp_path: Path) -> None:
    record(tmp_path, 1000.0)
    assert health.verdict(tmp_path, now=1012.4) == (True, "worker w1: heartbeat acknowledged 12s ago")


def test_a_heartbeat_older_than_grace_is_not(tmp_path: Path) -> None:
    record(tmp_path, 1000.0)
    assert health.verdict(tmp_path, now=1075.0) == (
        False,
        "worker w1: its last acknowledged heartbeat was 75s ago, longer than the server's grace_seconds (50s)",
    )


def test_a_worker_whose_process_is_gone_is_not(tmp_path: Path) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    record(tmp_path, 1000.0, pid=gone.pid)
    assert health.verdict(tmp_path, now=1001.0) == (False, f"worker w1: its process (pid {gone.pid}) is not running")


def test_no_record_and_a_bad_one(tmp_path: Path) -> None:
    ok, line = health.verdict(tmp_path)
    assert not ok and line == f"no acknowledged heartbeat yet ({tmp_path / 'health.json'} does not exist)"
    (tmp_path / "health.json").write_text("{not json")
    ok, line = health.verdict(tmp_path)
    assert not ok and line == f"{tmp_path / 'health.json'} cannot be read: ValidationError"
