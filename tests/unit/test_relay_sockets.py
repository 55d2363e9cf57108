"""The relay's sockets, without a server: each slot's socket answers for the job it was last added for alone, and
forwards nothing once that job is removed (it answers `lease_lost` until its slot's next job), however adds and
removes interleave on the relay's loop."""

from __future__ import annotations

import http.client
import json
import socket
import threading
from pathlib import Path
from typing import ClassVar

import pytest

from piloop_common.protocol.worker import RELAY_JOB_HEADER
from piloop_worker.lease import HeldLease
from piloop_worker.relay import Relay


class _Upstream:
    """Stands in for the worker's API client: answers each forwarded call with the job it came for."""

    headers: ClassVar[dict[str, str]] = {}

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def request(self, method: str, path: str, body, headers, timeout):
        with self.lock:
            self.calls.append((headers[RELAY_JOB_HEADER], path))
        return 200, json.dumps({"job": headers[RELAY_JOB_HEADER]}).encode()

    def close(self) -> None:
        pass


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: Path) -> None:
        super().__init__("relay", timeout=10)
        self.path_ = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(str(self.path_))


def _ask(path: Path) -> str:
    """The job a call through `path` was forwarded for, or the error it was refused with."""
    conn = _UnixConnection(path)
    try:
        conn.request("GET", "/v1/relay/job")
        resp = conn.getresponse()
        got = json.loads(resp.read())
        assert resp.status == (200 if "job" in got else 409), (resp.status, got)
        return got.get("job") or got["error"]
    finally:
        conn.close()


@pytest.fixture
def relay():
    up = _Upstream()
    r = Relay(lambda: up, timeout=5)
    yield r, up
    r.close()


def test_each_socket_answers_for_its_job_until_removed(relay, tmp_path: Path) -> None:
    r, up = relay
    live: dict[str, Path] = {}
    for i in range(60):  # a socket dropped and another added take the same fd again and again
        job = f"j{i}"
        live[job] = tmp_path / f"{i}.sock"
        r.add(HeldLease(job, "t"), live[job])
        if i % 3 == 2:  # drop an older one between adds
            gone = f"j{i - 2}"
            r.remove(gone)
            path = live.pop(gone)
            assert _ask(path) == "lease_lost"  # bound still, for its slot's next job; nothing of the last forwarded
        for name, path in live.items():
            assert _ask(path) == name
    assert {job for job, _ in up.calls} == {f"j{i}" for i in range(60)}
    assert all(path == "/v1/relay/job" for _, path in up.calls)


def test_a_socket_added_again_replaces_the_first(relay, tmp_path: Path) -> None:
    r, _ = relay
    r.add(HeldLease("j", "t"), tmp_path / "a.sock")
    r.add(HeldLease("j", "t"), tmp_path / "b.sock")  # a re-attached job: the first listener is closed, its file left
    assert _ask(tmp_path / "b.sock") == "j"
    with pytest.raises(ConnectionRefusedError):
        _ask(tmp_path / "a.sock")
    r.remove("j")
    r.remove("j")  # twice: nothing left to drop
    assert _ask(tmp_path / "b.sock") == "lease_lost"


def test_a_slots_socket_is_switched_to_its_next_job_and_forwards_nothing_for_the_last(relay, tmp_path: Path) -> None:
    r, up = relay
    path = tmp_path / "slot.sock"
    r.add(HeldLease("j1", "t1"), path)
    assert _ask(path) == "j1"
    r.remove("j1")
    assert _ask(path) == "lease_lost"
    r.add(HeldLease("j2", "t2"), path)  # the same listener, its lease switched: no bind
    assert _ask(path) == "j2"
    assert [job for job, _ in up.calls] == ["j1", "j2"]


def test_a_socket_dir_gone_is_made_again(relay, tmp_path: Path) -> None:
    r, _ = relay
    path = tmp_path / "gone" / "relay.sock"
    r.add(HeldLease("j", "t"), path)
    assert _ask(path) == "j"


def test_after_close_nothing_listens(tmp_path: Path) -> None:
    r = Relay(_Upstream, timeout=5)
    r.add(HeldLease("j", "t"), tmp_path / "a.sock")
    r.close()
    assert not r.thread.is_alive()
    with pytest.raises(ConnectionRefusedError):
        _ask(tmp_path / "a.sock")
    r.add(HeldLease("k", "t"), tmp_path / "b.sock")  # a late add after close listens nowhere and raises nothing
    with pytest.raises(ConnectionRefusedError):
        _ask(tmp_path / "b.sock")
    r.close()
