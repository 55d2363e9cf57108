"""The API client's kept-alive connections (piloop_common.connections) against a real HTTP server on loopback and on
a unix socket: reuse, a connection the server closed while idle, query strings, errors."""

from __future__ import annotations

import http.server
import json
import os
import resource
import select
import socket
import socketserver
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from piloop_common.client import ApiClient
from piloop_common.connections import ConnectFailed, Connections
from piloop_common.errors import NotFound, Unavailable


class _Echo(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _answer(self) -> None:
        n = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(n) if n else b""
        if self.path.startswith("/missing"):
            out, status = json.dumps({"error": "not_found", "message": "no such job j1"}).encode(), 404
        else:
            out, status = (
                json.dumps(
                    {
                        "method": self.command,
                        "path": self.path,
                        "body": body.decode(),
                        "port": self.client_address[1] if self.client_address else None,
                        "auth": self.headers.get("authorization"),
                    }
                ).encode(),
                200,
            )
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(out)))
        if self.server.close_after:  # type: ignore[attr-defined]
            self.send_header("connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(out)

    do_GET = do_POST = _answer

    def log_message(self, *a: object) -> None:
        pass


class _TCP(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    close_after = False


class _Unix(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    close_after = False

    def get_request(self):  # BaseHTTPRequestHandler wants a (host, port) address
        conn, _ = super().get_request()
        return conn, ("local", 0)


@pytest.fixture
def tcp() -> Iterator[_TCP]:
    srv = _TCP(("127.0.0.1", 0), _Echo)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def test_a_connection_is_kept_for_the_next_call_and_the_body_and_query_arrive(tcp):
    c = Connections(url=f"http://127.0.0.1:{tcp.server_address[1]}/api")
    first = json.loads(
        c.request("POST", "/v1/x", body=b'{"a":1}', headers={"authorization": "Bearer t"}, timeout=5).body
    )
    second = json.loads(
        c.request("GET", "/v1/y", headers={}, params={"all": True, "n": 3, "none": None}, timeout=5).body
    )
    assert first["path"] == "/api/v1/x" and first["body"] == '{"a":1}' and first["auth"] == "Bearer t"
    assert second["path"] == "/api/v1/y?all=true&n=3&none="
    third = json.loads(c.request("GET", "/v1/z?a=1", headers={}, params={"b": 2}, timeout=5).body)
    assert third["path"] == "/api/v1/z?a=1&b=2"  # a path's own query (a relayed request line) kept
    assert second["port"] == first["port"], "the second call made a new connection"
    c.close()


def test_a_connection_the_server_says_it_closes_is_not_kept(tcp):
    c = Connections(url=f"http://127.0.0.1:{tcp.server_address[1]}")
    tcp.close_after = True
    before = json.loads(c.request("GET", "/a", headers={}, timeout=5).body)
    assert c._idle == [], "a connection the server said it closes was kept"
    tcp.close_after = False
    after = json.loads(c.request("GET", "/b", headers={}, timeout=5).body)
    assert after["port"] != before["port"]


def test_an_idle_connection_past_its_keepalive_is_dropped(tcp):
    c = Connections(url=f"http://127.0.0.1:{tcp.server_address[1]}", keepalive=0.0)
    a = json.loads(c.request("GET", "/a", headers={}, timeout=5).body)
    b = json.loads(c.request("GET", "/b", headers={}, timeout=5).body)
    assert a["port"] != b["port"]


def test_a_connection_the_server_closed_while_idle_is_seen_before_the_next_call(monkeypatch, tcp):
    # the server ends a connection idle 0.2 s (as uvicorn does at its keep-alive timeout); the client must see the
    # EOF waiting on the idle socket and not send on it (that call would fail: RemoteDisconnected)
    monkeypatch.setattr(_Echo, "timeout", 0.2)
    c = Connections(url=f"http://127.0.0.1:{tcp.server_address[1]}")
    a = json.loads(c.request("GET", "/a", headers={}, timeout=5).body)
    ((conn, _),) = c._idle
    deadline = time.monotonic() + 10
    while not select.select([conn.sock], [], [], 0.05)[0]:
        assert time.monotonic() < deadline, "the server never closed the idle connection"
    b = json.loads(c.request("GET", "/b", headers={}, timeout=5).body)
    assert b["path"] == "/b" and b["port"] != a["port"]


def test_nothing_listening_is_a_connect_failure_and_the_client_says_where():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with pytest.raises(ConnectFailed):
        Connections(url=f"http://127.0.0.1:{port}").request("GET", "/v1/x", headers={}, timeout=2)
    with ApiClient(url=f"http://127.0.0.1:{port}") as api, pytest.raises(Unavailable) as e:
        api.call("GET", "/v1/x")
    assert f"http://127.0.0.1:{port} cannot be reached: ConnectionRefusedError" in str(e.value)


def test_the_unix_socket_and_a_missing_daemon(tmp_path: Path):
    path = tmp_path / "piloop.sock"
    with ApiClient(socket=path) as api, pytest.raises(Unavailable) as e:
        api.call("GET", "/v1/x")
    assert f"no daemon answers on {path}" in str(e.value)
    srv = _Unix(str(path), _Echo)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        with ApiClient(socket=path, token="t") as api:
            got = api.call("POST", "/v1/x", {"n": 1})
            assert got["path"] == "/v1/x" and json.loads(got["body"]) == {"n": 1} and got["auth"] == "Bearer t"
            with pytest.raises(NotFound, match="no such job j1"):
                api.call("GET", "/missing")
    finally:
        srv.shutdown()
        srv.server_close()


def test_a_url_that_is_not_http_is_refused():
    with pytest.raises(ValueError, match="http"):
        Connections(url="ftp://example.com")


def test_a_kept_connection_past_fd_1023_is_checked_and_reused(tcp):
    # a process holding many descriptors (the bench's 1,000 simulated workers): select(2) refuses fds past 1,023
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"RLIMIT_NOFILE's hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    held = []
    try:
        while not held or held[-1] < 1030:
            held.append(os.open(os.devnull, os.O_RDONLY))
        c = Connections(url=f"http://127.0.0.1:{tcp.server_address[1]}")
        a = json.loads(c.request("GET", "/a", headers={}, timeout=5).body)
        ((conn, _),) = c._idle
        assert conn.sock.fileno() > 1023
        b = json.loads(c.request("GET", "/b", headers={}, timeout=5).body)
        assert b["port"] == a["port"]
        c.close()
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
