"""Which provider runs a pool's `compute`: the one function that knows every platform. The platforms import the
interface (`base.py`), never this module; modal and docker are imported only when a pool uses them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from piloop_common.config.docker import DockerCompute
from piloop_common.config.provisioner import LocalCompute, ModalCompute
from piloop_server.provisioner.base import Provider


def open_provider(
    pool: str,
    compute: LocalCompute | ModalCompute | DockerCompute,
    *,
    url: str,
    home: Path,
    tag: str,
    cas_plugins: dict[str, Any],
) -> Provider:
    """The provider of a pool's `compute`; modal and docker are imported only when a pool uses them."""
    if isinstance(compute, LocalCompute):
        from piloop_server.provisioner.local import LocalProvider

        return LocalProvider(pool, compute, url=url, home=home, tag=tag, cas_plugins=cas_plugins)
    if isinstance(compute, DockerCompute):
        from piloop_server.provisioner.docker import DockerProvider

        return DockerProvider(pool, compute, url=url, tag=tag, cas_plugins=cas_plugins)
    from piloop_server.provisioner.modal import ModalProvider

    return ModalProvider(pool, compute, url=url, tag=tag)
