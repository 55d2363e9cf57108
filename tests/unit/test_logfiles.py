"""The copy-truncate rotation of the daemon's logs, on real files."""

from __future__ import annotations

from pathlib import Path

from piloop_server.logfiles import copy_path, known, rotate


def _write(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


def test_a_file_over_the_cap_is_copied_to_dot_1_and_truncated(tmp_path):
    log = tmp_path / "worker-serve.log"
    _write(log, b"a" * 101)
    assert rotate(log, 100, 2) == 101
    assert log.stat().st_size == 0
    assert copy_path(log, 1).read_bytes() == b"a" * 101
    assert not copy_path(log, 2).exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["worker-serve.log", "worker-serve.log.1"]


def test_older_copies_shift_up_to_the_keep_count_and_the_oldest_is_removed(tmp_path):
    log = tmp_path / "daemon.log"
    for generation in b"abcd":
        _write(log, bytes([generation]) * 200)
        assert rotate(log, 100, 2) == 200
    assert copy_path(log, 1).read_bytes() == b"d" * 200
    assert copy_path(log, 2).read_bytes() == b"c" * 200
    assert sorted(p.name for p in tmp_path.iterdir()) == ["daemon.log", "daemon.log.1", "daemon.log.2"]


def test_a_lowered_keep_count_removes_the_copies_beyond_it(tmp_path):
    log = tmp_path / "daemon.log"
    for n in (1, 2, 3, 4):
        copy_path(log, n).write_bytes(b"old")
    _write(log, b"x" * 200)
    rotate(log, 100, 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["daemon.log", "daemon.log.1"]
    assert copy_path(log, 1).read_bytes() == b"x" * 200


def test_keep_0_empties_the_file_and_keeps_no_copy(tmp_path):
    log = tmp_path / "daemon.log"
    copy_path(log, 1).write_bytes(b"old")
    _write(log, b"x" * 200)
    assert rotate(log, 100, 0) == 200
    assert [p.name for p in tmp_path.iterdir()] == ["daemon.log"]
    assert log.stat().st_size == 0


def test_a_writer_holding_an_append_descriptor_writes_at_the_new_start(tmp_path):
    log = tmp_path / "tasks-default.log"
    with open(log, "ab", buffering=0) as writer:  # as a child that inherited its stdout opened "ab"
        writer.write(b"before\n" * 30)
        assert rotate(log, 100, 2) == 210
        writer.write(b"after\n")
        assert log.read_bytes() == b"after\n"  # no hole of 210 NULs before it
        writer.write(b"more\n")
    assert log.read_bytes() == b"after\nmore\n"
    assert copy_path(log, 1).read_bytes() == b"before\n" * 30


def test_a_file_under_or_at_the_cap_is_left_alone(tmp_path):
    log = tmp_path / "daemon.log"
    _write(log, b"x" * 100)
    assert rotate(log, 100, 2) == 0
    assert log.read_bytes() == b"x" * 100
    assert [p.name for p in tmp_path.iterdir()] == ["daemon.log"]


def test_a_missing_file_or_a_cap_of_0_does_nothing(tmp_path):
    assert rotate(tmp_path / "daemon.log", 100, 2) == 0
    assert list(tmp_path.iterdir()) == []
    log = tmp_path / "daemon.log"
    _write(log, b"x" * 1000)
    assert rotate(log, 0, 2) == 0
    assert log.stat().st_size == 1000


def test_the_known_files_are_the_daemons_by_name_and_each_started_workers_log(tmp_path):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "mine.log").write_bytes(b"a user's file")
    for name in ("gpu-1", "gpu-2"):
        (tmp_path / "provisioned" / name).mkdir(parents=True)
    (tmp_path / "provisioned" / "stray.txt").write_bytes(b"not a home")
    got = [p.relative_to(tmp_path).as_posix() for p in known(tmp_path, ["default", "provisioner.gpu"])]
    assert got == [
        "logs/daemon.log",
        "logs/worker-serve.log",
        "logs/tasks-default.log",
        "logs/tasks-provisioner.gpu.log",
        "redis/redis.log",
        "provisioned/gpu-1/worker.log",
        "provisioned/gpu-2/worker.log",
    ]
