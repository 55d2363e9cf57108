"""The API client (piloop_common.sdk.client) against real HTTP servers on loopback, on a unix socket and behind a
forwarding proxy: kept-alive connections, a connection the server closed while idle, query strings, the proxy
environment, errors (a refused connection, a missing daemon, an untrusted certificate, a url that is not http)."""

from __future__ import annotations

import http.client
import http.server
import json
import os
import resource
import select
import socket
import socketserver
import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from piloop_common.errors import ConfigError, NotFound, Unavailable
from piloop_common.sdk import client as client_mod
from piloop_common.sdk.client import ApiClient
from piloop_common.sdk.remote import Servers
from tests.helpers.certs import make_pki
from tests.helpers.slowdown import scaled

PROXY_ENV = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")


@pytest.fixture(autouse=True)
def no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No proxy setting from the caller's environment: each test names its own."""
    for name in PROXY_ENV:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    monkeypatch.delenv("REQUEST_METHOD", raising=False)  # urllib ignores HTTP_PROXY under CGI


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
                        "extra": self.headers.get("x-extra"),
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

    do_GET = do_POST = do_PUT = _answer

    def log_message(self, *a: object) -> None:
        pass


class _Proxy(http.server.BaseHTTPRequestHandler):
    """A forward proxy for http:// targets: each request line (absolute-URI) recorded, then sent on as it came."""

    protocol_version = "HTTP/1.1"
    hop = ("connection", "proxy-connection", "keep-alive", "transfer-encoding", "content-length")

    def _forward(self) -> None:
        self.server.seen.append(f"{self.command} {self.path}")  # type: ignore[attr-defined]
        n = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(n) if n else None
        target = urlsplit(self.path)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in self.hop}
        upstream = http.client.HTTPConnection(target.hostname or "", target.port or 80, timeout=5)
        try:
            upstream.request(self.command, target.path + (f"?{target.query}" if target.query else ""), body, headers)
            resp = upstream.getresponse()
            data = resp.read()
        finally:
            upstream.close()
        self.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in self.hop:
                self.send_header(k, v)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = _forward

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


@contextmanager
def serving(srv: socketserver.BaseServer) -> Iterator[socketserver.BaseServer]:
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.fixture
def tcp() -> Iterator[_TCP]:
    with serving(_TCP(("127.0.0.1", 0), _Echo)) as srv:
        yield srv


@pytest.fixture
def proxy() -> Iterator[_TCP]:
    srv = _TCP(("127.0.0.1", 0), _Proxy)
    srv.seen = []  # type: ignore[attr-defined]
    with serving(srv):
        yield srv


def url(srv: socketserver.BaseServer, path: str = "") -> str:
    return f"http://127.0.0.1:{srv.server_address[1]}{path}"


def test_one_connection_serves_every_call_and_the_body_query_and_headers_arrive(tcp):
    with ApiClient(url=url(tcp, "/api"), token="t") as api:
        first = api.call("POST", "/v1/x", {"a": 1})
        second = api.call("GET", "/v1/y", params={"all": True, "n": 3, "none": None})
        third = api.call("GET", "/v1/z?a=1", params={"b": 2})
        status, raw = api.request("GET", "/v1/w", headers={"x-extra": "e", "authorization": "Bearer other"})
        blob = api.call_bytes("PUT", "/v1/b", content=b"\x00\x01").json()
    assert first["path"] == "/api/v1/x" and json.loads(first["body"]) == {"a": 1} and first["auth"] == "Bearer t"
    assert second["path"] == "/api/v1/y?all=true&n=3&none="
    assert third["path"] == "/api/v1/z?a=1&b=2"  # a path's own query (a relayed request line) kept
    fourth = json.loads(raw)
    assert status == 200 and fourth["extra"] == "e" and fourth["auth"] == "Bearer other"  # a header given wins
    assert blob["path"] == "/api/v1/b" and blob["auth"] == "Bearer t"
    ports = {a["port"] for a in (first, second, third, fourth, blob)}
    assert len(ports) == 1, f"the calls made {len(ports)} connections"


def test_headers_set_after_the_first_call_go_with_the_next(tcp):
    with ApiClient(url=url(tcp)) as api:
        assert api.call("GET", "/a")["extra"] is None
        api.headers["x-extra"] = "later"
        assert api.call("GET", "/b")["extra"] == "later"


def test_a_tcp_connection_has_nagle_off(tcp):
    # the head and a body that follows it in a second write: with Nagle on, the server's delayed ACK holds the body
    with ApiClient(url=url(tcp)) as api:
        resp = api.http.post("/a", content=b"x")
        sock = resp.extensions["network_stream"].get_extra_info("socket")
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)


def test_a_connection_the_server_says_it_closes_is_not_kept(tcp):
    with ApiClient(url=url(tcp)) as api:
        tcp.close_after = True
        before = api.call("GET", "/a")
        tcp.close_after = False
        after = api.call("GET", "/b")
    assert after["port"] != before["port"]


def test_an_idle_connection_past_its_keepalive_is_dropped(monkeypatch, tcp):
    monkeypatch.setattr(client_mod, "KEEPALIVE_SECONDS", 0.0)
    with ApiClient(url=url(tcp)) as api:
        a = api.call("GET", "/a")
        b = api.call("GET", "/b")
    assert a["port"] != b["port"]


def test_a_connection_the_server_closed_while_idle_is_seen_before_the_next_call(monkeypatch, tcp):
    # the server ends a connection idle 0.2 s (as uvicorn does at its keep-alive timeout): the client must see the
    # EOF waiting on the idle socket and not send on it (that call would fail: the server disconnected)
    monkeypatch.setattr(_Echo, "timeout", 0.2)
    with ApiClient(url=url(tcp)) as api:
        first = api.http.get("/a")
        sock = first.extensions["network_stream"].get_extra_info("socket")
        deadline = time.monotonic() + scaled(10)
        while not select.select([sock], [], [], 0.05)[0]:
            assert time.monotonic() < deadline, "the server never closed the idle connection"
        b = api.call("GET", "/b")
    assert b["path"] == "/b" and b["port"] != first.json()["port"]


def test_nothing_listening_is_unavailable_and_says_where():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with ApiClient(url=f"http://127.0.0.1:{port}") as api:
        for send in (lambda: api.call("GET", "/v1/x"), lambda: api.call_bytes("GET", "/v1/x")):
            with pytest.raises(Unavailable) as e:
                send()
            assert str(e.value).startswith(f"http://127.0.0.1:{port} cannot be reached: ConnectionRefusedError: ")


def test_the_unix_socket_and_a_missing_daemon(tmp_path: Path):
    path = tmp_path / "piloop.sock"
    with ApiClient(socket=path) as api, pytest.raises(Unavailable) as e:
        api.call("GET", "/v1/x")
    assert f"no daemon answers on {path}" in str(e.value)
    with serving(_Unix(str(path), _Echo)), ApiClient(socket=path, token="t") as api:
        got = api.call("POST", "/v1/x", {"n": 1})
        assert got["path"] == "/v1/x" and json.loads(got["body"]) == {"n": 1} and got["auth"] == "Bearer t"
        with pytest.raises(NotFound, match="no such job j1"):
            api.call("GET", "/missing")


@pytest.mark.parametrize("bad", ["ftp://example.com", "example.com:8080", "http://"])
def test_a_url_that_is_not_http_is_refused(bad):
    with pytest.raises(ValueError, match=r"the server's url is http\(s\)://host\[:port\]"):
        ApiClient(url=bad)


def test_an_untrusted_certificate_is_said_so_and_a_trusted_one_answers(monkeypatch, tmp_path):
    pki = make_pki(tmp_path / "pki")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(pki.cert, pki.key)
    srv = _TCP(("127.0.0.1", 0), _Echo)
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    where = f"https://127.0.0.1:{srv.server_address[1]}"
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    with serving(srv):
        with ApiClient(url=where) as api, pytest.raises(Unavailable) as e:
            api.call("GET", "/a")
        assert e.value.details.get("tls") == "untrusted"
        assert str(e.value).startswith(f"{where}: the server's certificate is not trusted (")
        assert str(e.value).endswith("set SSL_CERT_FILE to the CA that signed it")
        monkeypatch.setenv("SSL_CERT_FILE", str(pki.ca))
        with ApiClient(url=where) as api:
            assert api.call("GET", "/a")["path"] == "/a"


def test_a_call_goes_through_the_proxy_the_environment_names(monkeypatch, tcp, proxy):
    monkeypatch.setenv("HTTP_PROXY", url(proxy))
    with ApiClient(url=url(tcp)) as api:
        got = api.call("POST", "/v1/x", {"a": 1})
    assert json.loads(got["body"]) == {"a": 1}
    assert proxy.seen == [f"POST {url(tcp, '/v1/x')}"], proxy.seen


def test_no_proxy_naming_the_host_goes_direct(monkeypatch, tcp, proxy):
    monkeypatch.setenv("HTTP_PROXY", url(proxy))
    monkeypatch.setenv("NO_PROXY", "example.com,127.0.0.1")
    with ApiClient(url=url(tcp)) as api:
        assert api.call("GET", "/v1/x")["path"] == "/v1/x"
    assert proxy.seen == []


def test_a_proxy_httpx_cannot_use_is_a_config_error_naming_the_setting(monkeypatch, tcp):
    monkeypatch.setenv("ALL_PROXY", "ftp://127.0.0.1:1")
    with ApiClient(url=url(tcp)) as api, pytest.raises(ConfigError, match="HTTPS_PROXY, HTTP_PROXY or ALL_PROXY"):
        api.call("GET", "/v1/x")


def test_the_daemons_socket_never_goes_through_a_proxy(monkeypatch, tmp_path, proxy):
    for name in ("HTTP_PROXY", "ALL_PROXY"):
        monkeypatch.setenv(name, url(proxy))
    path = tmp_path / "piloop.sock"
    with serving(_Unix(str(path), _Echo)), ApiClient(socket=path) as api:
        assert api.call("GET", "/v1/x")["path"] == "/v1/x"
    assert proxy.seen == []


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
        with ApiClient(url=url(tcp)) as api:
            first = api.http.get("/a")
            assert first.extensions["network_stream"].get_extra_info("socket").fileno() > 1023
            b = api.call("GET", "/b")
        assert b["port"] == first.json()["port"]
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.parametrize(
    "url", ["http://10.1.2.3:8443", "http://piloop.example.com", "http://0.0.0.0:80", "HTTP://192.168.1.1", "ftp://x"]
)
def test_a_remote_client_refuses_plain_http_off_the_loopback_and_what_is_no_url(url):
    with pytest.raises(ConfigError) as e:
        ApiClient.remote(url, token="plt_x")
    assert url in e.value.message
    if url.lower().startswith("http:"):
        assert "plain http" in e.value.message and "https://" in e.value.message


def test_a_remote_client_takes_https_and_loopback_http_and_its_token_in_order(tmp_path, monkeypatch):
    for var in ("PILOOP_TOKEN", "PILOOP_HTTPS_TOKEN", "PILOOP_CA"):
        monkeypatch.delenv(var, raising=False)
    for url in ("https://piloop.example.com:8443/", "http://127.0.0.1:8000", "http://localhost", "http://[::1]:80"):
        assert ApiClient.remote(url).url == url.rstrip("/")
    monkeypatch.setenv("PILOOP_HTTPS_TOKEN", "plt_worker")
    assert ApiClient.remote("http://127.0.0.1:1").headers["authorization"] == "Bearer plt_worker"
    monkeypatch.setenv("PILOOP_TOKEN", "plt_env")
    assert ApiClient.remote("http://127.0.0.1:1").headers["authorization"] == "Bearer plt_env"
    f = tmp_path / "tok"
    f.write_text("plt_file\nsecond line\n")
    assert ApiClient.remote("http://127.0.0.1:1", token_file=f).headers["authorization"] == "Bearer plt_file"
    f.write_text("\n")
    with pytest.raises(ConfigError, match="the file is empty"):
        ApiClient.remote("http://127.0.0.1:1", token_file=f)
    with pytest.raises(ConfigError, match="no such file"):
        ApiClient.remote("https://127.0.0.1:1", ca=tmp_path / "missing.pem")
    (tmp_path / "bad.pem").write_text("not a certificate")
    with pytest.raises(ConfigError, match="not a CA certificate"):
        ApiClient.remote("https://127.0.0.1:1", ca=tmp_path / "bad.pem")


def _dead_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_a_server_list_moves_every_client_to_the_next_on_a_refused_connection_and_stays_there():
    dead = f"http://127.0.0.1:{_dead_port()}"
    with serving(_TCP(("127.0.0.1", 0), _Echo)) as one:
        servers = Servers.parse(f"{dead}, {url(one)},{url(one)}/")
        assert servers.urls == [dead, url(one)]  # blanks, duplicates and a trailing slash dropped
        a, b = ApiClient(url=servers), ApiClient(url=servers)
        with pytest.raises(Unavailable, match=f"{dead} cannot be reached"):
            a.call("GET", "/v1/x")
        assert servers.current == url(one)
        assert a.call("GET", "/v1/x")["port"] and b.call("GET", "/v1/y")["path"] == "/v1/y"  # both on the next
        assert a.where == url(one) and b.url == url(one)
        b.call("GET", "/v1/z")
        assert servers.current == url(one)  # an answer keeps it
        servers.failed(dead)  # a late failure of a server already left moves nothing
        assert servers.current == url(one)
        a.close()
        b.close()


@pytest.mark.parametrize("bad", ["", " , ", "ftp://h", "http://", "https://ok:1,nohost"])
def test_a_server_list_names_the_url_that_is_not_one(bad):
    with pytest.raises(ConfigError, match="--server"):
        Servers.parse(bad)
