"""What a job's relay costs the worker, whatever the job does: thousands of connections to one socket take no
thread each, a job over its cap of calls is told so and does not hold up another job, a connection that sends
nothing loses its slot, and a call of a removed job is not forwarded."""

from __future__ import annotations

import contextlib
import json
import resource
import select
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from piloop_common.protocol.worker import RELAY_JOB_HEADER
from piloop_worker import relay as relay_mod
from piloop_worker.lease import HeldLease
from piloop_worker.relay import CALL_THREADS, FORWARDS_PER_JOB, MAX_CALLS_PER_JOB, Relay
from tests.helpers.redis import wait_for

CALL = b"GET /v1/relay/job HTTP/1.0\r\nhost: relay\r\n\r\n"
BUSY = {
    "error": "busy",
    "message": f"this job has {MAX_CALLS_PER_JOB} relay calls in flight, the most a job may have; try again",
}


class _Upstream:
    """Stands in for the worker's API client: answers each call with its job, holding the calls of `hold`'s jobs
    until `release` is set."""

    headers: ClassVar[dict[str, str]] = {}

    def __init__(self, hold: set[str] | None = None) -> None:
        self.hold = hold or set()
        self.release = threading.Event()
        self.calls: list[str] = []
        self.held = 0
        self.lock = threading.Lock()

    def request(self, method: str, path: str, body, headers, timeout):
        job = headers[RELAY_JOB_HEADER]
        with self.lock:
            self.calls.append(job)
            self.held += job in self.hold
        if job in self.hold:
            assert self.release.wait(60)
        return 200, json.dumps({"job": job}).encode()

    def close(self) -> None:
        self.release.set()


@pytest.fixture
def relay() -> Iterator[tuple[Relay, _Upstream]]:
    up = _Upstream(hold={"a"})
    r = Relay(lambda: up, timeout=5)
    yield r, up
    up.release.set()
    r.close()


def _connect(path: Path, send: bytes = CALL) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(str(path))  # blocking: waits for room in the listener's backlog
    if send:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # answered busy and closed already
            s.sendall(send)
    return s


def _answer(s: socket.socket, timeout: float = 30) -> tuple[int | str, dict | None]:
    """The status and JSON body the relay answered on `s` once it closed it, or 'refused' (nothing answered)."""
    s.settimeout(timeout)
    data = b""
    try:
        while chunk := s.recv(65536):
            data += chunk
    except ConnectionResetError:  # closed with our call unread (answered busy): what it wrote comes first
        pass
    finally:
        s.close()
    if not data:
        return "refused", None
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def _answered(socks: list[socket.socket]) -> int:
    """How many of `socks` have an answer waiting (or were closed)."""
    poll = select.poll()
    for s in socks:
        poll.register(s, select.POLLIN)
    return len(poll.poll(0))


def _threads() -> tuple[int, int]:
    """Python's threads and the kernel's, in this process."""
    status = Path("/proc/self/status").read_text()
    return threading.active_count(), int(next(ln for ln in status.splitlines() if ln.startswith("Threads:")).split()[1])


@pytest.fixture
def fds() -> Iterator[int]:
    """Descriptors to spare: the soft limit raised to the hard one for the test."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    yield (hard if hard != resource.RLIM_INFINITY else 1 << 16) - 500  # the relay's side, pytest's own
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_thousands_of_connections_to_one_job_leave_the_threads_bounded(fds, tmp_path: Path) -> None:
    n = min(3000, fds)
    assert n > 10 * MAX_CALLS_PER_JOB, f"only {fds} descriptors to spare"
    before = _threads()
    up = _Upstream(hold={"j"})
    r = Relay(lambda: up, timeout=5)
    try:
        r.add(HeldLease("j", "t"), tmp_path / "j.sock")
        socks = [_connect(tmp_path / "j.sock") for _ in range(n)]
        wait_for(lambda: up.held == FORWARDS_PER_JOB, what="the job's share of the pool held")
        wait_for(lambda: _answered(socks) == n - MAX_CALLS_PER_JOB, what="every call over the cap answered at once")
        during = _threads()  # every connection open on our side, the job's calls held in the relay's threads
        print(f"threads with {n} connections open: {before} before, {during} during (python, kernel)")
        assert during[0] <= before[0] + 1 + CALL_THREADS and during[1] <= before[1] + 1 + CALL_THREADS, (before, during)
        up.release.set()
        answers = [_answer(s) for s in socks]
    finally:
        up.release.set()
        r.close()
    statuses = Counter(status for status, _ in answers)
    assert statuses[200] == MAX_CALLS_PER_JOB and statuses[503] + statuses["refused"] == n - MAX_CALLS_PER_JOB, statuses
    assert all(body == BUSY for status, body in answers if status == 503)
    assert len(up.calls) == MAX_CALLS_PER_JOB


def test_a_job_over_its_cap_does_not_hold_up_another(relay, tmp_path: Path) -> None:
    r, up = relay
    r.add(HeldLease("a", "t"), tmp_path / "a.sock")
    r.add(HeldLease("b", "t"), tmp_path / "b.sock")
    held = [_connect(tmp_path / "a.sock") for _ in range(MAX_CALLS_PER_JOB)]
    wait_for(lambda: r.leases["a"].calls == MAX_CALLS_PER_JOB and up.held == FORWARDS_PER_JOB, what="a's calls held")
    assert _answer(_connect(tmp_path / "a.sock")) == (503, BUSY)
    assert _answer(_connect(tmp_path / "b.sock"), timeout=10) == (200, {"job": "b"})
    up.release.set()
    assert [_answer(s) for s in held] == [(200, {"job": "a"})] * MAX_CALLS_PER_JOB


def test_a_connection_that_sends_nothing_loses_its_slot(relay, monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setattr(relay_mod, "READ_SECONDS", 1.0)
    r, _ = relay
    r.add(HeldLease("j", "t"), tmp_path / "j.sock")
    t0 = time.monotonic()
    idle = [_connect(tmp_path / "j.sock", send=b"GET /v1/relay/job HTTP/1.0\r\n") for _ in range(2)]
    idle += [_connect(tmp_path / "j.sock", send=b"") for _ in range(MAX_CALLS_PER_JOB - 2)]
    wait_for(lambda: r.leases["j"].calls == MAX_CALLS_PER_JOB, what="every slot taken")
    assert _answer(_connect(tmp_path / "j.sock")) == (503, BUSY)
    for s in idle:  # each answered and closed once the timeout passed, not before
        status, body = _answer(s, timeout=10)
        assert status == 408 and body is not None and body["error"] == "timeout", (status, body)
    assert time.monotonic() - t0 >= 1.0
    wait_for(lambda: r.leases["j"].calls == 0, what="the slots given back")
    assert _answer(_connect(tmp_path / "j.sock")) == (200, {"job": "j"})


@pytest.mark.parametrize(
    ("call", "status", "error"),
    [
        (b"GET\r\n\r\n", 400, "bad_request"),
        (b"GET /v1/relay/job HTTP/1.0\r\nno colon here\r\n\r\n", 400, "bad_request"),
        (b"POST /v1/relay/progress HTTP/1.0\r\ncontent-length: ten\r\n\r\n", 400, "bad_request"),
        (b"POST /v1/relay/progress HTTP/1.0\r\ncontent-length: 10\r\n\r\n{}", 400, "bad_request"),
        (f"POST /v1/relay/progress HTTP/1.0\r\ncontent-length: {(1 << 20) + 1}\r\n\r\n".encode(), 413, "too_large"),
        (b"PUT /v1/relay/progress HTTP/1.0\r\n\r\n", 501, "not_implemented"),
        (b"GET /v1/jobs HTTP/1.0\r\n\r\n", 404, "not_found"),
    ],
)
def test_a_call_the_relay_will_not_forward_is_told_why(relay, tmp_path: Path, call, status, error) -> None:
    r, up = relay
    r.add(HeldLease("j", "t"), tmp_path / "j.sock")
    s = _connect(tmp_path / "j.sock", send=call)
    if call.endswith(b"{}"):
        s.shutdown(socket.SHUT_WR)  # the body ends short of its length
    got, body = _answer(s, timeout=10)
    assert (got, body and body["error"]) == (status, error), body
    assert body is not None and body["message"]
    assert not up.calls


def test_a_call_of_a_removed_job_is_not_forwarded(relay, tmp_path: Path) -> None:
    r, up = relay
    r.add(HeldLease("a", "t"), tmp_path / "a.sock")
    socks = [_connect(tmp_path / "a.sock") for _ in range(FORWARDS_PER_JOB + 1)]
    wait_for(lambda: r.leases["a"].calls == FORWARDS_PER_JOB + 1 and up.held == FORWARDS_PER_JOB, what="a's calls")
    r.remove("a")  # the job reported: the calls already sent finish, the one still waiting is not sent
    up.release.set()
    answers = [_answer(s) for s in socks]
    assert sorted(status for status, _ in answers) == [200] * FORWARDS_PER_JOB + [409]
    assert [body["error"] for status, body in answers if status == 409] == ["lease_lost"]  # type: ignore[index]
    assert len(up.calls) == FORWARDS_PER_JOB
