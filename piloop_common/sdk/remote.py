"""Reaching a remote server: the environment that names it and its token, the URL check that keeps a token off
plain http, the TLS context, a token file, and a worker's list of servers to fail over between."""

from __future__ import annotations

import os
import ssl
import threading
from pathlib import Path
from urllib.parse import urlsplit

from piloop_common.errors import ConfigError

SERVER_ENV = "PILOOP_SERVER"  # a remote API for the CLI and the Python client
TOKEN_ENV = "PILOOP_TOKEN"  # their token (a role's)
WORKER_TOKEN_ENV = "PILOOP_HTTPS_TOKEN"  # a worker's token; the CLI's too when PILOOP_TOKEN is unset
CA_ENV = "PILOOP_CA"  # the CA that signed the server's certificate, for the CLI and the Python client


def ssl_context(ca: str | Path | None = None) -> ssl.SSLContext:
    """The CA `ca` names, else `SSL_CERT_FILE`, else the system's trust store."""
    cafile = str(ca) if ca else os.environ.get("SSL_CERT_FILE")
    if ca and not Path(ca).is_file():
        raise ConfigError(f"--ca {ca}: no such file (give the PEM of the CA that signed the server's certificate)")
    try:
        return ssl.create_default_context(cafile=cafile) if cafile else ssl.create_default_context()
    except ssl.SSLError as e:
        raise ConfigError(f"{cafile}: not a CA certificate in PEM ({e.reason or e})") from e


def check_remote_url(url: str) -> str:
    """`url` without a trailing slash when the CLI or a program may send a token to it: https, or plain http to a
    loopback address only (an SSH tunnel); else ConfigError saying what to do."""
    from piloop_common.listen import is_loopback

    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"server {url}: give the server's URL, like https://piloop.example.com:8443")
    if scheme == "http" and not is_loopback(parts.hostname):
        raise ConfigError(
            f"server {url}: plain http to {parts.hostname} would send the token in the clear; use https:// (the "
            "server's [plugins.network] tls, with --ca or PILOOP_CA for a private CA), or an SSH tunnel to "
            "http://127.0.0.1:PORT"
        )
    return url.rstrip("/")


def read_token_file(path: str | Path) -> str:
    """The token on the first line of `path`, or ConfigError naming the file."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ConfigError(f"--token-file {path}: {e.strerror or e}") from e
    token = text.strip().splitlines()[0].strip() if text.strip() else ""
    if not token:
        raise ConfigError(f"--token-file {path}: the file is empty")
    return token


class Servers:
    """A worker's servers, in the order given (`--server URL1,URL2`): every client made from one list dials the
    server that answered last, and a failure to connect moves them all to the next one (the caller's retries, with
    their backoff, pace the round); one that answers is kept until it fails."""

    def __init__(self, urls: list[str]) -> None:
        if not urls:
            raise ConfigError("--server: give at least one server URL")
        self.urls = urls
        self._at = 0
        self._lock = threading.Lock()

    @classmethod
    def parse(cls, text: str) -> Servers:
        """Comma-separated URLs, each http(s)://host[:port]; ConfigError naming the one that is not."""
        urls: list[str] = []
        for part in (p.strip() for p in text.split(",")):
            if not part:
                continue
            parts = urlsplit(part)
            if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
                raise ConfigError(f"--server {part}: a server's URL is http(s)://host[:port]")
            if part.rstrip("/") not in urls:
                urls.append(part.rstrip("/"))
        return cls(urls)

    @property
    def current(self) -> str:
        with self._lock:
            return self.urls[self._at]

    def failed(self, url: str) -> None:
        """`url` could not be reached: move on, unless another client already did."""
        with self._lock:
            if len(self.urls) > 1 and self.urls[self._at] == url:
                self._at = (self._at + 1) % len(self.urls)
