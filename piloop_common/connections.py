"""Kept-alive HTTP/1.1 connections for the API client's calls: the standard library's `http.client`.

A worker makes one call a round (its reports carrying its claim) and a heartbeat every few seconds. Each went
through httpx at ~1.4 ms of the worker's CPU; the same call through `http.client` costs ~0.5 ms (docs/performance.md,
the ninth round). httpx stays where its streaming and its models earn their cost (the `http` CAS, `call_bytes`).
"""

from __future__ import annotations

import http.client
import select
import socket
import ssl
import threading
import time
from typing import NamedTuple
from urllib.parse import quote, urlencode, urlsplit


class Answer(NamedTuple):
    status: int
    body: bytes


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("piloop", timeout=timeout)
        self.unix_path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.settimeout(self.timeout)
            s.connect(self.unix_path)
        except BaseException:
            s.close()
            raise
        self.sock = s


class ConnectFailed(OSError):
    """No connection could be made (nothing sent): the cause is `__cause__`."""


class Connections:
    """Idle connections to one server, each reused for the next call until it has been idle `keepalive` seconds or
    the server closed it. Safe across threads: a connection serves one call at a time."""

    def __init__(
        self,
        *,
        url: str | None = None,
        socket_path: str | None = None,
        context: ssl.SSLContext | None = None,
        keepalive: float = 25.0,
    ) -> None:
        self.keepalive = keepalive
        self.socket_path = socket_path
        self.context = context
        self.prefix = ""
        if socket_path is None:
            parts = urlsplit(url or "")
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"{url!r}: the server's url is http(s)://host[:port]")
            self.https = parts.scheme == "https"
            self.host = parts.hostname
            self.port = parts.port or (443 if self.https else 80)
            self.prefix = parts.path.rstrip("/")
            self.host_header = parts.netloc.rpartition("@")[2]
        else:
            self.https = False
            self.host_header = "piloop"
        self._idle: list[tuple[http.client.HTTPConnection, float]] = []
        self._lock = threading.Lock()

    def _new(self, timeout: float) -> http.client.HTTPConnection:
        if self.socket_path is not None:
            return _UnixConnection(self.socket_path, timeout)
        if self.https:
            return http.client.HTTPSConnection(self.host, self.port, timeout=timeout, context=self.context)
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def _take(self) -> http.client.HTTPConnection | None:
        """The most recently used idle connection that is still open, or None."""
        now = time.monotonic()
        while True:
            with self._lock:
                if not self._idle:
                    return None
                conn, since = self._idle.pop()
            # a server that closed an idle connection left it readable (EOF): sending on it would fail after the fact
            if now - since < self.keepalive and conn.sock is not None and not _readable(conn.sock):
                return conn
            conn.close()

    def _give(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            self._idle.append((conn, time.monotonic()))

    def request(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None = None,
        headers: dict[str, str],
        params: dict[str, object] | None = None,
        timeout: float,
    ) -> Answer:
        # a path may carry its own query (the relay forwards a job's request line as it came)
        target = self.prefix + quote(path, safe="/:@!$&'()*+,;=-._~%?")
        if params:
            target += ("&" if "?" in target else "?") + urlencode({k: _param(v) for k, v in params.items()})
        conn = self._take()
        if conn is None:
            conn = self._new(timeout)
            try:
                conn.connect()
            except OSError as e:
                conn.close()
                raise ConnectFailed(str(e)) from e
            if conn.sock is not None and self.socket_path is None:
                # the head and a body that follows it in a second write: without it, Nagle and delayed ACKs hold one
                conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            conn.sock.settimeout(timeout)
            conn.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
            conn.putheader("Host", self.host_header)
            for name, value in headers.items():
                conn.putheader(name, value)
            if body is not None or method in ("POST", "PUT", "PATCH"):
                conn.putheader("Content-Length", str(len(body or b"")))
            conn.endheaders(body)
            resp = conn.getresponse()
            data = resp.read()
        except BaseException:
            conn.close()
            raise
        if resp.will_close:
            conn.close()
        else:
            self._give(conn)
        return Answer(resp.status, data)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn, _ in idle:
            conn.close()


def _readable(sock: socket.socket) -> bool:
    """Whether `sock` has something to read now: poll(2), not select(2), which fails past fd 1,023."""
    p = select.poll()
    p.register(sock, select.POLLIN)
    return bool(p.poll(0))


def _param(v: object) -> str:
    """A query value as httpx writes it: booleans lower case, None empty."""
    if v is True:
        return "true"
    if v is False:
        return "false"
    return "" if v is None else str(v)
