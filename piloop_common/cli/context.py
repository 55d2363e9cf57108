"""What every command gets in `ctx.obj`: the home, settings loaded once, and API clients.

Settings and the HTTP client are imported on first use, so `piloop --help` starts fast. `--server` (or
`PILOOP_SERVER`) sends every command that calls the API to that server instead of the local daemon's socket.
"""

from __future__ import annotations

import os
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from piloop_common.config.settings import Settings
    from piloop_common.sdk.client import ApiClient


class Cli:
    def __init__(
        self,
        home: Path | None,
        *,
        server: str | None = None,
        token_file: Path | None = None,
        ca: Path | None = None,
        server_flag: bool = False,
    ) -> None:
        self.home = (home or Path(os.environ.get("PILOOP_HOME") or Path.home() / ".piloop")).expanduser().absolute()
        self.server = server or None
        self.token_file = token_file
        self.ca = ca
        self.server_flag = server_flag  # given as --server, not found in PILOOP_SERVER

    @cached_property
    def settings(self) -> Settings:
        from piloop_common.config.load import load_settings

        return load_settings(self.home)

    @property
    def remote(self) -> bool:
        """Whether `api()` calls a server by URL (not the local socket, nor a job's relay)."""
        from piloop_common.cli.relay import relay_path

        return self.server is not None and (self.server_flag or relay_path() is None)

    def api(self, timeout: float = 30.0) -> ApiClient:
        """A client of `--server` (`PILOOP_SERVER`), else of the local daemon over its socket; inside a job, of the
        job's relay unless `--server` is given (a `PILOOP_SERVER` the job inherited does not bypass its relay)."""
        from piloop_common.cli.relay import relay_client, relay_path
        from piloop_common.sdk.client import ApiClient

        if self.remote:
            assert self.server is not None
            return ApiClient.remote(self.server, token_file=self.token_file, ca=self.ca, timeout=timeout)
        if (relay := relay_path()) is not None:
            return relay_client(relay, timeout)
        return self.local_api(timeout)

    def local_api(self, timeout: float = 30.0) -> ApiClient:
        """The local daemon over its socket, whatever `--server` says (the daemon's own start and stop)."""
        from piloop_common.sdk.client import ApiClient

        return ApiClient.local(self.home, timeout=timeout)
