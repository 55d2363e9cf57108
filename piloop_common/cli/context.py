"""What every command gets in `ctx.obj`: the home, settings loaded once, and API clients.

Settings and the HTTP client are imported on first use, so `piloop --help` starts fast.
"""

from __future__ import annotations

import os
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from piloop_common.client import ApiClient
    from piloop_common.config import Settings


class Cli:
    def __init__(self, home: Path | None) -> None:
        self.home = (home or Path(os.environ.get("PILOOP_HOME") or Path.home() / ".piloop")).expanduser().absolute()

    @cached_property
    def settings(self) -> Settings:
        from piloop_common.configload import load_settings

        return load_settings(self.home)

    def api(self, timeout: float = 30.0) -> ApiClient:
        """A client of the local daemon, over its unix socket; inside a job, of the job's relay."""
        from piloop_common.cli.relay import relay_client, relay_path

        if (relay := relay_path()) is not None:
            return relay_client(relay, timeout)
        from piloop_common.client import ApiClient

        return ApiClient.local(self.home, timeout=timeout)
