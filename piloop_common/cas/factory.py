"""`open_store`: the `Store` a `[plugins.cas]` config describes."""

from __future__ import annotations

import os
from pathlib import Path

from piloop_common.cas.base import Store
from piloop_common.cas.config import CachedCasConfig, CasConfig, HttpCasConfig, LocalCasConfig, S3CasConfig
from piloop_common.errors import ConfigError
from piloop_common.extras import install_line, missing


def open_store(cfg: CasConfig, home: Path, token: str | None = None) -> Store:
    """Open the store; providers import their client libraries (boto3, httpx) only here. An `http` CAS (also as a
    `cached` one's remote) takes its config's `token`, else `token` (a worker's own, from the environment or its
    `--token-file`), else `PILOOP_HTTPS_TOKEN`."""
    if isinstance(cfg, LocalCasConfig):
        from piloop_common.cas.local import LocalStore

        return LocalStore(_under(home, cfg.path, "cas"))
    if isinstance(cfg, S3CasConfig):
        if missing(("boto3",)):  # a worker-only install: the s3 provider's library is an extra
            raise ConfigError(
                f'[plugins.cas] provider = "s3" needs boto3, which is not installed: {install_line("s3")}'
            )
        from piloop_common.cas.s3 import S3Store

        return S3Store(cfg)
    if isinstance(cfg, HttpCasConfig):
        from piloop_common.cas.http import HttpStore

        given = cfg.token.get_secret_value() if cfg.token else token or os.environ.get("PILOOP_HTTPS_TOKEN")
        return HttpStore(cfg.url, token=given, timeout=cfg.timeout_seconds)
    if isinstance(cfg, CachedCasConfig):
        from piloop_common.cas.cached import CachedStore

        remote = open_store(cfg.remote, home, token)
        return CachedStore(remote, _under(home, cfg.path, "cas-cache"), max_bytes=int(cfg.local_max_gb * 1e9))
    raise ConfigError(f"[plugins.cas] names an unknown provider: {cfg!r}")


def _under(home: Path, path: str | None, default: str) -> Path:
    return home / Path(path).expanduser() if path else home / default
