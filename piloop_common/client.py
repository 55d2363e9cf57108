"""The API client: the unix socket for local callers, HTTPS (or loopback HTTP) for workers."""

from __future__ import annotations

import os
import socket as socket_mod
import ssl
from pathlib import Path
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel

from piloop_common.errors import PiloopError, Unavailable, from_payload

M = TypeVar("M", bound=BaseModel)
SOCKET_NAME = "piloop.sock"
# A worker's heartbeat comes every renew_seconds (10 s by default): the server keeps an idle connection longer than
# that, so each heartbeat rides the last one's (no new connection, no TLS handshake), and the client lets it go a
# little before the server does, so it never sends on one the server is closing ("Server disconnected without
# sending a response", seen when both kept 5 s)
SERVER_KEEPALIVE_SECONDS = 30.0
KEEPALIVE_SECONDS = 25.0
SERVER_ENV = "PILOOP_SERVER"  # a remote API for the CLI's `attach` and the Python client
TOKEN_ENV = "PILOOP_HTTPS_TOKEN"
LIMITS = httpx.Limits(max_connections=100, max_keepalive_connections=20, keepalive_expiry=KEEPALIVE_SECONDS)


def ssl_context() -> ssl.SSLContext:
    """The system's trust store, or `SSL_CERT_FILE` for a certificate the system does not trust."""
    cafile = os.environ.get("SSL_CERT_FILE")
    return ssl.create_default_context(cafile=cafile) if cafile else ssl.create_default_context()


def _untrusted(e: BaseException) -> str:
    """The verification error when `e` comes from a certificate that failed verification, else ''."""
    seen: BaseException | None = e
    while seen is not None:
        if isinstance(seen, ssl.SSLCertVerificationError):
            return seen.verify_message or str(seen)
        seen = seen.__cause__ or seen.__context__
    return ""


class ApiClient:
    def __init__(self, *, url: str | None = None, socket: Path | None = None, token: str | None = None,
                 worker: str | None = None, timeout: float = 10.0) -> None:
        if (url is None) == (socket is None):
            raise ValueError("give the server's url or its socket")
        headers = {}
        if token:
            headers["authorization"] = f"Bearer {token}"
        if worker:
            headers["x-piloop-worker"] = worker
        if socket is not None:
            self.where = f"the daemon's socket {socket}"
            transport = httpx.HTTPTransport(uds=str(socket), limits=LIMITS)
            self.http = httpx.Client(base_url="http://piloop", transport=transport, headers=headers, timeout=timeout)
        else:
            self.where = url or ""
            # httpx writes a request's head and body apart: without TCP_NODELAY, Nagle's algorithm and the
            # server's delayed ACK hold the body ~40 ms
            # plain http never uses a trust store: loading one costs ~60 ms of CPU for each client made
            verify = ssl_context() if (url or "").lower().startswith("https:") else False
            transport = httpx.HTTPTransport(verify=verify, limits=LIMITS, socket_options=[
                (socket_mod.IPPROTO_TCP, socket_mod.TCP_NODELAY, 1)])
            self.http = httpx.Client(base_url=url or "", headers=headers, timeout=timeout, transport=transport)
        self.socket = socket

    @classmethod
    def local(cls, home: Path, **kw: Any) -> "ApiClient":
        return cls(socket=home / SOCKET_NAME, **kw)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> "ApiClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @classmethod
    def from_env(cls, home: Path | None = None, **kw: Any) -> "ApiClient":
        """`PILOOP_SERVER` (a URL, with `PILOOP_HTTPS_TOKEN` as its bearer token when set), else the local
        daemon's socket under `home` (default `PILOOP_HOME`, else ~/.piloop)."""
        url = os.environ.get(SERVER_ENV)
        if url:
            return cls(url=url.rstrip("/"), token=os.environ.get(TOKEN_ENV) or None, **kw)
        if home is None:
            home = Path(os.environ.get("PILOOP_HOME") or Path.home() / ".piloop").expanduser().absolute()
        return cls.local(home, **kw)

    def call(self, method: str, path: str, body: BaseModel | dict[str, Any] | None = None,
             params: dict[str, Any] | None = None, model: type[M] | None = None, timeout: float | None = None) -> Any:
        payload = body.model_dump(mode="json") if isinstance(body, BaseModel) else body
        resp = self._send(method, path, timeout, json=payload, params=params)
        if resp.status_code == 204 or not resp.content:
            return None
        data = resp.json()
        return model.model_validate(data) if model is not None else data

    def call_bytes(self, method: str, path: str, content: bytes | None = None, timeout: float | None = None,
                   headers: dict[str, str] | None = None) -> httpx.Response:
        """A call whose request or answer is raw bytes (CAS blobs, log chunks); errors map as in `call`."""
        return self._send(method, path, timeout, content=content, headers=headers)

    def _send(self, method: str, path: str, timeout: float | None, **kw: Any) -> httpx.Response:
        if timeout is not None:
            kw["timeout"] = timeout
        try:
            resp = self.http.request(method, path, **kw)
        except httpx.TransportError as e:
            if self.socket is not None and isinstance(e, httpx.ConnectError):
                raise Unavailable(f"no daemon answers on {self.socket}: start one with `piloop serve --detach`") from e
            untrusted = _untrusted(e)
            if untrusted:
                raise Unavailable(f"{self.where}: the server's certificate is not trusted ({untrusted}); for a "
                                  "certificate your system does not trust, set SSL_CERT_FILE to the CA that signed it",
                                  tls="untrusted") from e
            raise Unavailable(f"{self.where} cannot be reached: {type(e).__name__}: {e}") from e
        if resp.status_code >= 400:
            try:
                data = resp.json()
            except ValueError:
                data = {"error": "http", "message": f"{resp.status_code} {resp.text[:200]}"}
            if not isinstance(data, dict) or "error" not in data:
                data = {"error": "http", "message": f"{resp.status_code}: {data}"}
            raise from_payload(data, resp.status_code)
        return resp


__all__ = ["ApiClient", "PiloopError", "ssl_context"]
