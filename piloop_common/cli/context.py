"""What every command gets in `ctx.obj`: the home, settings loaded once, and API clients."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path

from piloop_common.client import ApiClient
from piloop_common.config import Settings, default_home, load_settings


class Cli:
    def __init__(self, home: Path | None) -> None:
        self.home = (home or default_home()).expanduser().absolute()

    @cached_property
    def settings(self) -> Settings:
        return load_settings(self.home)

    def api(self, timeout: float = 30.0) -> ApiClient:
        """A client of the local daemon, over its unix socket."""
        return ApiClient.local(self.home, timeout=timeout)
