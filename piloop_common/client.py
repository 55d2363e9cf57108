"""The API client: the unix socket for local callers, HTTPS (or loopback HTTP) for workers."""

from __future__ import annotations

import functools
import http.client
import json
import os
import socket as socket_mod
import ssl
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, overload

from pydantic import BaseModel

from piloop_common.connections import ConnectFailed, Connections
from piloop_common.errors import PiloopError, Unavailable, from_payload

if TYPE_CHECKING:
    import httpx

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
    """The JSON calls (`call`) go through kept-alive `http.client` connections (piloop_common.connections); raw bytes
    (`call_bytes`) through httpx, made on first use, so a worker never imports it."""

    def __init__(
        self,
        *,
        url: str | None = None,
        socket: Path | None = None,
        token: str | None = None,
        worker: str | None = None,
        timeout: float = 10.0,
    ) -> None:
        if (url is None) == (socket is None):
            raise ValueError("give the server's url or its socket")
        self.headers: dict[str, str] = {}
        if token:
            self.headers["authorization"] = f"Bearer {token}"
        if worker:
            self.headers["x-piloop-worker"] = worker
        self.timeout = timeout
        self.socket = socket
        self.url = url
        # plain http never uses a trust store: loading one costs ~60 ms of CPU for each client made
        self._ssl = ssl_context() if (url or "").lower().startswith("https:") else None
        if socket is not None:
            self.where = f"the daemon's socket {socket}"
            self.connections = Connections(socket_path=str(socket), keepalive=KEEPALIVE_SECONDS)
        else:
            self.where = url or ""
            self.connections = Connections(url=url, context=self._ssl, keepalive=KEEPALIVE_SECONDS)

    @functools.cached_property
    def http(self) -> httpx.Client:
        """An httpx client to the same server, with this client's `headers` as they are when it is made."""
        import httpx

        limits = httpx.Limits(max_connections=100, max_keepalive_connections=20, keepalive_expiry=KEEPALIVE_SECONDS)
        if self.socket is not None:
            transport = httpx.HTTPTransport(uds=str(self.socket), limits=limits)
            return httpx.Client(
                base_url="http://piloop", transport=transport, headers=self.headers, timeout=self.timeout
            )
        # httpx writes a request's head and body apart: without TCP_NODELAY, Nagle's algorithm and the
        # server's delayed ACK hold the body ~40 ms
        transport = httpx.HTTPTransport(
            verify=self._ssl or False,
            limits=limits,
            socket_options=[(socket_mod.IPPROTO_TCP, socket_mod.TCP_NODELAY, 1)],
        )
        return httpx.Client(base_url=self.url or "", headers=self.headers, timeout=self.timeout, transport=transport)

    @classmethod
    def local(cls, home: Path, **kw: Any) -> ApiClient:
        return cls(socket=home / SOCKET_NAME, **kw)

    def close(self) -> None:
        self.connections.close()
        if "http" in self.__dict__:
            self.http.close()

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @classmethod
    def from_env(cls, home: Path | None = None, **kw: Any) -> ApiClient:
        """`PILOOP_SERVER` (a URL, with `PILOOP_HTTPS_TOKEN` as its bearer token when set), else the local
        daemon's socket under `home` (default `PILOOP_HOME`, else ~/.piloop)."""
        url = os.environ.get(SERVER_ENV)
        if url:
            return cls(url=url.rstrip("/"), token=os.environ.get(TOKEN_ENV) or None, **kw)
        if home is None:
            home = Path(os.environ.get("PILOOP_HOME") or Path.home() / ".piloop").expanduser().absolute()
        return cls.local(home, **kw)

    @overload
    def call(
        self,
        method: str,
        path: str,
        body: BaseModel | dict[str, Any] | None = None,
        params: dict[str, Any] | None = None,
        *,
        model: type[M],
        timeout: float | None = None,
    ) -> M: ...

    @overload
    def call(
        self,
        method: str,
        path: str,
        body: BaseModel | dict[str, Any] | None = None,
        params: dict[str, Any] | None = None,
        model: None = None,
        timeout: float | None = None,
    ) -> Any: ...

    def call(
        self,
        method: str,
        path: str,
        body: BaseModel | dict[str, Any] | None = None,
        params: dict[str, Any] | None = None,
        model: type[M] | None = None,
        timeout: float | None = None,
    ) -> Any:
        payload = body.model_dump(mode="json") if isinstance(body, BaseModel) else body
        headers = self.headers
        data = None
        if payload is not None:
            headers = {**headers, "content-type": "application/json"}
            data = json.dumps(payload, separators=(",", ":"), allow_nan=False).encode()
        status, content = self.request(method, path, data, headers=headers, params=params, timeout=timeout)
        if status >= 400:
            raise _error(status, content)
        if status == 204 or not content:
            return None
        out = json.loads(content)
        return model.model_validate(out) if model is not None else out

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        *,
        headers: dict[str, str] | None = None,
        params: dict[str, Any] | None = None,
        timeout: float | None = None,
    ) -> tuple[int, bytes]:
        """One call as it is: the status and the body, whatever the status; an unreachable server is `Unavailable`."""
        headers = self.headers if headers is None else headers
        try:
            return self.connections.request(
                method,
                path,
                body=body,
                headers=headers,
                params=params,
                timeout=self.timeout if timeout is None else timeout,
            )
        except (OSError, http.client.HTTPException) as e:
            raise self._unavailable(e, connecting=isinstance(e, ConnectFailed)) from e

    def call_bytes(
        self,
        method: str,
        path: str,
        content: bytes | None = None,
        timeout: float | None = None,
        headers: dict[str, str] | None = None,
    ) -> httpx.Response:
        """A call whose request or answer is raw bytes (CAS blobs, log chunks); errors map as in `call`."""
        import httpx

        kw: dict[str, Any] = {"content": content, "headers": headers}
        if timeout is not None:
            kw["timeout"] = timeout
        try:
            resp = self.http.request(method, path, **kw)
        except httpx.TransportError as e:
            raise self._unavailable(e, connecting=isinstance(e, httpx.ConnectError)) from e
        if resp.status_code >= 400:
            raise _error(resp.status_code, resp.content)
        return resp

    def _unavailable(self, e: BaseException, *, connecting: bool) -> Unavailable:
        if self.socket is not None and connecting:
            return Unavailable(f"no daemon answers on {self.socket}: start one with `piloop serve --detach`")
        untrusted = _untrusted(e)
        if untrusted:
            return Unavailable(
                f"{self.where}: the server's certificate is not trusted ({untrusted}); for a "
                "certificate your system does not trust, set SSL_CERT_FILE to the CA that signed it",
                tls="untrusted",
            )
        cause = e.__cause__ if isinstance(e, ConnectFailed) and e.__cause__ is not None else e
        return Unavailable(f"{self.where} cannot be reached: {type(cause).__name__}: {cause}")


def _error(status: int, content: bytes) -> PiloopError:
    """The server's error answer as the PiloopError it names."""
    try:
        data = json.loads(content)
    except ValueError:
        data = {"error": "http", "message": f"{status} {content[:200].decode(errors='replace')}"}
    if not isinstance(data, dict) or "error" not in data:
        data = {"error": "http", "message": f"{status}: {data}"}
    return from_payload(data, status)


__all__ = ["ApiClient", "PiloopError", "ssl_context"]
