"""Which Redis `[plugins.state]` names, read into one record: a URL redis-py reads, or Sentinels and a service.

The Sentinel form is the one the `redis-sentinel-url` package defined and RedisVL and prefect-redis read:
`redis+sentinel://[user:pass@]host1:26379,host2:26379/service[/db]` (`rediss+sentinel://`: TLS to the master and to
the Sentinels), without their `?options`. The password may instead come from `password_file`, and the Sentinels' own
from `sentinel_password_file`; each is kept out of every repr, log and error.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from urllib.parse import unquote, urlsplit

from piloop_common.config.settings import StateConfig
from piloop_common.errors import ConfigError

SENTINEL_SCHEMES = {"redis+sentinel": False, "rediss+sentinel": True}  # the scheme -> TLS
SENTINEL_PORT = 26379


@dataclass(frozen=True)
class Target:
    url: str = ""  # a URL for redis-py's parse_url (empty for Sentinel)
    sentinels: tuple[tuple[str, int], ...] = ()
    service: str = ""
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    tls: bool = False
    ca_file: str | None = None
    sentinel_password: str | None = field(default=None, repr=False)  # the Sentinels' own, not the master's

    @property
    def sentinel(self) -> bool:
        return bool(self.sentinels)

    def where(self) -> str:
        """The target for a message: hosts and service, never a password."""
        if self.sentinel:
            hosts = ",".join(f"{h}:{p}" for h, p in self.sentinels)
            return f"Sentinel {hosts} service {self.service!r}"
        return _without_password(self.url)


def read(st: StateConfig, url: str) -> Target:
    """The record for `url` (the state URL, or the embedded Redis's), with `password_file` and `ca_file` applied."""
    password = _password_file(st.password_file, "password_file") if st.password_file is not None else None
    ca = str(st.ca_file) if st.ca_file is not None else None
    if ca is not None and not Path(ca).is_file():
        raise ConfigError(f"[plugins.state] ca_file {ca} is not a readable file")
    scheme = url.partition("://")[0].lower()
    if scheme in SENTINEL_SCHEMES:
        t = _sentinel(url, SENTINEL_SCHEMES[scheme], password, ca)
        if st.sentinel_password_file is None:
            return t
        return replace(t, sentinel_password=_password_file(st.sentinel_password_file, "sentinel_password_file"))
    if st.sentinel_password_file is not None:
        raise ConfigError("[plugins.state] sentinel_password_file is for a redis+sentinel:// url, and url is not one")
    if scheme not in ("redis", "rediss", "unix"):
        raise ConfigError(
            f"[plugins.state] url must start redis://, rediss://, unix://, redis+sentinel:// or rediss+sentinel://, "
            f"not {scheme or 'nothing'}://"
        )
    parts = urlsplit(url)
    return Target(
        url=url,
        username=unquote(parts.username) if parts.username else None,
        password=password if password is not None else (unquote(parts.password) if parts.password else None),
        tls=scheme == "rediss",
        ca_file=ca,
    )


def _sentinel(url: str, tls: bool, password: str | None, ca: str | None) -> Target:
    rest = url.partition("://")[2]
    if "?" in rest:
        raise ConfigError("[plugins.state] url: a Sentinel URL takes no ?options (password_file and ca_file are keys)")
    netloc, _, path = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    if not at:
        userinfo, hosts = "", netloc
    user, colon, pw = userinfo.partition(":")
    sentinels = tuple(_host(h) for h in hosts.split(",") if h)
    if not sentinels:
        raise ConfigError("[plugins.state] url names no Sentinel: redis+sentinel://host:26379[,host2:26379]/service")
    service, _, db = path.strip("/").partition("/")
    if not service:
        raise ConfigError("[plugins.state] url names no Sentinel service: redis+sentinel://host:26379/<service>[/db]")
    if db and not db.isdigit():
        raise ConfigError(f"[plugins.state] url's database must be a number, not {db!r}")
    return Target(
        sentinels=sentinels,
        service=unquote(service),
        db=int(db or 0),
        username=unquote(user) if user else None,
        password=password if password is not None else (unquote(pw) if colon and pw else None),
        tls=tls,
        ca_file=ca,
    )


def _host(text: str) -> tuple[str, int]:
    host, colon, port = text.rpartition(":")
    if not colon:
        return text, SENTINEL_PORT
    if not port.isdigit():
        raise ConfigError(f"[plugins.state] url's Sentinel {text!r}: the port must be a number")
    return host.strip("[]"), int(port)


def _password_file(path: Path, key: str) -> str:
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        raise ConfigError(f"[plugins.state] {key} {path} cannot be read: {e.strerror}") from None
    if not lines or not lines[0]:
        raise ConfigError(f"[plugins.state] {key} {path} is empty")
    return lines[0]


def _without_password(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return parts._replace(netloc=f"{user}:***@{host}").geturl()
