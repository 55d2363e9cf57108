"""Where a browser reaches the page: `[plugins.network] url`, else the address `piloop serve --listen` took."""

from __future__ import annotations

from piloop_common.config.settings import Settings
from piloop_common.errors import Conflict
from piloop_common.listen import parse_listen

NO_LISTENER = (
    "`piloop serve` listens only on its unix socket, which a browser cannot open: start it with "
    '`piloop serve --listen 127.0.0.1:8080` (or set `listen = "127.0.0.1:8080"` under `[plugins.network]` in '
    "config.toml; an address other than loopback needs `tls`), then run `piloop ui` again"
)


def base_url(settings: Settings, listen: str) -> str:
    """The page's origin, or Conflict saying how to get a TCP listener."""
    net = settings.plugins.network
    if net.url:
        return net.url.rstrip("/")
    if not listen:
        raise Conflict(NO_LISTENER)
    host, port = parse_listen(listen)
    host = f"[{host}]" if ":" in host else ("127.0.0.1" if host in ("0.0.0.0", "") else host)
    scheme = "https" if net.tls and net.tls != "proxy" else "http"
    return f"{scheme}://{host}:{port}"
