"""The API client: the unix socket for local callers, HTTPS (or loopback HTTP) for workers and remote callers."""

from __future__ import annotations

import functools
import json
import os
import ssl
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, overload
from urllib.parse import quote, urlsplit

import httpx

from piloop_common.errors import ConfigError, PiloopError, Unavailable, from_payload
from piloop_common.sdk.remote import (
    CA_ENV,
    SERVER_ENV,
    TOKEN_ENV,
    WORKER_TOKEN_ENV,
    Servers,
    check_remote_url,
    read_token_file,
    ssl_context,
)

if TYPE_CHECKING:
    from pydantic import BaseModel

M = TypeVar("M", bound="BaseModel")
SOCKET_NAME = "piloop.sock"
# A worker's heartbeat comes every renew_seconds (10 s by default): the server keeps an idle connection longer than
# that, so each heartbeat rides the last one's (no new connection, no TLS handshake), and the client lets it go a
# little before the server does, so it never sends on one the server is closing ("Server disconnected without
# sending a response", seen when both kept 5 s)
SERVER_KEEPALIVE_SECONDS = 30  # uvicorn takes whole seconds
KEEPALIVE_SECONDS = 25.0
UNTRUSTED_HINT = "set SSL_CERT_FILE to the CA that signed it"
REMOTE_UNTRUSTED_HINT = "give --ca (or PILOOP_CA) the PEM of the CA that signed it"


def _untrusted(e: BaseException) -> str:
    """The verification error when `e` comes from a certificate that failed verification, else ''."""
    seen: BaseException | None = e
    while seen is not None:
        if isinstance(seen, ssl.SSLCertVerificationError):
            return seen.verify_message or str(seen)
        seen = seen.__cause__ or seen.__context__
    return ""


# OpenSSL's reasons when what answered a TLS hello is not TLS (an HTTP server's `HTTP/1.1 400` read as a record)
PLAIN_REASONS = frozenset(
    {"WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "UNKNOWN_PROTOCOL", "PACKET_LENGTH_TOO_LONG"}
)


def _plain_http(e: BaseException) -> bool:
    """Whether `e` comes from a TLS handshake that met a server speaking plain HTTP (or anything but TLS)."""
    seen: BaseException | None = e
    while seen is not None:
        if isinstance(seen, ssl.SSLError) and getattr(seen, "reason", None) in PLAIN_REASONS:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def part(value: object) -> str:
    """One path segment from what a user typed (a job id, a name): quoted whole, so `../x` or `a/b` names the thing
    it says and never another route."""
    return quote(str(value), safe="")


class ApiClient:
    """Every call goes through one httpx client, made on first use: kept-alive connections, and for a URL the proxy
    the environment names (`HTTPS_PROXY`, `HTTP_PROXY`, `ALL_PROXY`, less `NO_PROXY`); the daemon's socket never
    goes through a proxy."""

    def __init__(
        self,
        *,
        url: str | Servers | None = None,  # a list of Servers: the one that answers
        socket: Path | None = None,
        token: str | None = None,
        worker: str | None = None,
        timeout: float = 10.0,
        ca: str | Path | None = None,
    ) -> None:
        if (url is None) == (socket is None):
            raise ValueError("give the server's url or its socket")
        self.servers = url if isinstance(url, Servers) else None
        if isinstance(url, Servers):
            url = url.current
        if url is not None:
            parts = urlsplit(url)
            if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
                raise ValueError(f"{url!r}: the server's url is http(s)://host[:port]")
        self.headers: dict[str, str] = {}
        if token:
            self.headers["authorization"] = f"Bearer {token}"
        if worker:
            self.headers["x-piloop-worker"] = worker
        self.timeout = timeout
        self.socket = socket
        self.url = url
        # plain http never uses a trust store: loading one costs ~60 ms of CPU for each client made
        self._ca = ca
        self._ssl = ssl_context(ca) if (url or "").lower().startswith("https:") else None
        self.untrusted_hint = UNTRUSTED_HINT  # what to do about a certificate that fails: the worker's way
        self.where = f"the daemon's socket {socket}" if socket is not None else url or ""

    @functools.cached_property
    def http(self) -> httpx.Client:
        """The httpx client to the server, with this client's `headers` as they are when it is made."""
        limits = httpx.Limits(max_connections=100, max_keepalive_connections=20, keepalive_expiry=KEEPALIVE_SECONDS)
        if self.socket is not None:
            # a transport of its own and trust_env off: no proxy setting ever applies to the local socket
            transport = httpx.HTTPTransport(uds=str(self.socket), limits=limits)
            return httpx.Client(
                base_url="http://piloop",
                transport=transport,
                headers=self.headers,
                timeout=self.timeout,
                trust_env=False,
            )
        # no transport given, so httpx mounts the proxies the environment names; httpcore sets TCP_NODELAY on each
        # TCP connection it makes (else Nagle and the server's delayed ACK would hold a body written after its head)
        try:
            return httpx.Client(
                base_url=self.url or "",
                headers=self.headers,
                timeout=self.timeout,
                verify=self._ssl or False,
                limits=limits,
            )
        except (ValueError, ImportError, httpx.InvalidURL) as e:  # a proxy URL httpx cannot use (socks5 needs socksio)
            raise ConfigError(
                f"the proxy that HTTPS_PROXY, HTTP_PROXY or ALL_PROXY names cannot be used for {self.where}: {e}"
            ) from e

    @classmethod
    def local(cls, home: Path, **kw: Any) -> ApiClient:
        return cls(socket=home / SOCKET_NAME, **kw)

    def close(self) -> None:
        if "http" in self.__dict__:
            self.http.close()

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @classmethod
    def remote(
        cls,
        url: str,
        *,
        token: str | None = None,
        token_file: str | Path | None = None,
        ca: str | Path | None = None,
        **kw: Any,
    ) -> ApiClient:
        """A client of the server at `url` (https, or http on a loopback address), as a person or a program: its
        token is `token`, else `token_file`'s first line, else `PILOOP_TOKEN`, else `PILOOP_HTTPS_TOKEN`; the
        server's CA is `ca`, else `PILOOP_CA`, else `SSL_CERT_FILE` or the system's."""
        url = check_remote_url(url)
        if token is None and token_file is not None:
            token = read_token_file(token_file)
        token = token or os.environ.get(TOKEN_ENV) or os.environ.get(WORKER_TOKEN_ENV) or None
        client = cls(url=url, token=token, ca=ca or os.environ.get(CA_ENV) or None, **kw)
        client.untrusted_hint = REMOTE_UNTRUSTED_HINT
        return client

    @classmethod
    def from_env(cls, home: Path | None = None, **kw: Any) -> ApiClient:
        """`PILOOP_SERVER` (a URL: see `remote`), else the local daemon's socket under `home` (default
        `PILOOP_HOME`, else ~/.piloop)."""
        url = os.environ.get(SERVER_ENV)
        if url:
            return cls.remote(url, **kw)
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
        payload = body if body is None or isinstance(body, dict) else body.model_dump(mode="json")
        headers = None
        data = None
        if payload is not None:
            headers = {"content-type": "application/json"}
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
        """One call as it is: the status and the body, whatever the status; an unreachable server is `Unavailable`.
        `headers` go with this client's `headers`, a name in both taking the value given here."""
        resp = self._send(method, path, content=body, headers=headers, params=params, timeout=timeout)
        return resp.status_code, resp.content

    def call_bytes(
        self,
        method: str,
        path: str,
        content: bytes | None = None,
        timeout: float | None = None,
        headers: dict[str, str] | None = None,
    ) -> httpx.Response:
        """A call whose request or answer is raw bytes (CAS blobs, log chunks); errors map as in `call`."""
        resp = self._send(method, path, content=content, headers=headers, timeout=timeout)
        if resp.status_code >= 400:
            raise _error(resp.status_code, resp.content)
        return resp

    def _send(
        self,
        method: str,
        path: str,
        *,
        content: bytes | None,
        headers: dict[str, str] | None,
        params: dict[str, Any] | None = None,
        timeout: float | None,
    ) -> httpx.Response:
        # this client's headers as they are now: a caller may set one after the httpx client was made
        headers = self.headers if headers is None else {**self.headers, **headers}
        if self.servers is not None and self.servers.current != self.url:
            self._move(self.servers.current)
        # httpx's params would replace a query the path carries: the path's own is kept
        target = httpx.URL(path).copy_merge_params(params) if params else path
        try:
            return self.http.request(
                method, target, content=content, headers=headers, timeout=self.timeout if timeout is None else timeout
            )
        except httpx.TransportError as e:
            connecting = isinstance(e, httpx.ConnectError)
            if self.servers is not None and (connecting or isinstance(e, httpx.ConnectTimeout)):
                self.servers.failed(self.url or "")  # the next call, this client's or another's, dials the next
            raise self._unavailable(e, connecting=connecting) from e

    def _move(self, url: str) -> None:
        """Dial `url` from now on (another of `servers`): a new httpx client, same headers, timeout and trust."""
        self.close()
        self.__dict__.pop("http", None)
        self.url = self.where = url
        if url.lower().startswith("https:") and self._ssl is None:
            self._ssl = ssl_context(self._ca)

    def _unavailable(self, e: BaseException, *, connecting: bool) -> Unavailable:
        if self.socket is not None and connecting:
            return Unavailable(f"no daemon answers on {self.socket}: start one with `piloop serve --detach`")
        if (self.url or "").lower().startswith("https:") and _plain_http(e):
            plain = "http:" + (self.url or "")[len("https:") :]
            where = urlsplit(plain).netloc
            # a setup mistake no retry fixes: the worker stops at start on it as on an untrusted certificate
            return Unavailable(f"the server speaks plain HTTP on {where}; use {plain}", tls="plain_http")
        untrusted = _untrusted(e)
        if untrusted:
            return Unavailable(
                f"{self.where}: the server's certificate is not trusted ({untrusted}); for a "
                f"certificate your system does not trust, {self.untrusted_hint}",
                tls="untrusted",
            )
        cause = _os_error(e) or e
        return Unavailable(f"{self.where} cannot be reached: {type(cause).__name__}: {cause}")


def _os_error(e: BaseException) -> OSError | None:
    """The system's error under httpx's and httpcore's wrappers (`ConnectionRefusedError: [Errno 111] …`), if any."""
    seen: BaseException | None = e
    while seen is not None:
        if isinstance(seen, OSError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _error(status: int, content: bytes) -> PiloopError:
    """The server's error answer as the PiloopError it names."""
    try:
        data = json.loads(content)
    except ValueError:
        data = {"error": "http", "message": f"{status} {content[:200].decode(errors='replace')}"}
    if not isinstance(data, dict) or "error" not in data:
        data = {"error": "http", "message": f"{status}: {data}"}
    return from_payload(data, status)


__all__ = ["ApiClient"]
