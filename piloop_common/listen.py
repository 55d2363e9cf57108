"""`--listen HOST:PORT`, and the rule that only a loopback address may go without TLS."""

from __future__ import annotations

import ipaddress
from typing import Any

from piloop_common.errors import ConfigError


def parse_listen(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--listen {listen}: give HOST:PORT, like 127.0.0.1:8443")
    return host.strip("[]"), int(port)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_listen(settings: Any, listen: str) -> tuple[str, int]:
    """HOST and PORT, or a ConfigError when a non-loopback address has no `[plugins.network] tls`."""
    host, port = parse_listen(listen)
    net = settings.plugins.network
    # the proxy network too: its claims are headers, and whoever reads the wire between the proxy and `listen`
    # reads every caller's credential; `tls = "proxy"` says the operator made that hop private
    if not is_loopback(host) and net.tls is None:
        raise ConfigError(
            f"--listen {listen}: {host} is not a loopback address, and [plugins.network] tls is not set. "
            'Set tls = { cert = "<cert.pem>", key = "<key.pem>" }, or tls = "proxy" when a proxy or an SSH tunnel '
            "ends TLS; or listen on 127.0.0.1"
        )
    return host, port


def serve_listen(settings: Any, listen: str | None = None) -> str | None:
    """The address `piloop serve` listens on beside its socket (`--listen`, else `[plugins.network] listen`), checked
    by `check_listen`; None for the socket alone. `piloop config check` runs it too."""
    where = listen or settings.plugins.network.listen
    if where:
        check_listen(settings, where)
    return where or None


def uvicorn_tls(settings: Any) -> dict[str, Any]:
    """uvicorn's TLS arguments for `[plugins.network] tls = {cert, key}` (none for "proxy" or unset)."""
    tls = settings.plugins.network.tls
    return {"ssl_certfile": tls.cert, "ssl_keyfile": tls.key} if tls is not None and tls != "proxy" else {}
