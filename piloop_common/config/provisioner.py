"""The provisioner's part of the settings: where a pool's workers are started (`[executor.pools.<name>.provisioner]`),
each key typed and described once (`reference` writes docs/configuration.md from it)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from piloop_common.config.docker import DockerCompute
from piloop_common.config.model import ConfigModel

# --- provisioner -------------------------------------------------------------------------


class LocalCompute(ConfigModel):
    provider: Literal["local"] = Field("local", description="Workers as processes on the server's machine.")
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment for each started worker.")
    hang: bool = Field(False, description="Start a process that never registers (for testing the register deadline).")
    refuse: bool = Field(
        False, description="Refuse every start as a platform would on quota (for testing the backoff)."
    )


class RegistryConfig(ConfigModel):
    kind: Literal["aws-ecr", "basic"] = Field(description="How the private registry is pulled from.")
    secret: str = Field(description="The Modal Secret holding the pull credentials.")


class ModalCompute(ConfigModel):
    provider: Literal["modal"] = Field("modal", description="Workers as Modal sandboxes of `image`.")
    image: str = Field(description="The image with piloop in it, as a registry reference.")
    registry: RegistryConfig | None = Field(None, description="The pull secret of a private registry.")
    gpu: str | None = Field(None, description="The GPU of each sandbox, as Modal names it (`A100`, `H100:2`).")
    cpu: float | None = Field(None, description="CPU cores requested per sandbox.")
    memory_mb: int | None = Field(None, description="Memory requested per sandbox, in MiB.")
    secrets: list[str] = Field(default_factory=list, description="Modal Secrets each sandbox gets as its environment.")
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment for each sandbox.")
    app: str = Field("piloop-workers", description="The Modal app the sandboxes belong to.")
    timeout_seconds: int = Field(24 * 3600, description="The platform's own backstop on a sandbox's life.")
    idle_timeout_seconds: int | None = Field(None, description="The platform's own idle backstop.")


ComputeConfig = Annotated[LocalCompute | ModalCompute | DockerCompute, Field(discriminator="provider")]


class ProvisionerConfig(ConfigModel):
    max: int = Field(ge=0, description="The most workers this pool runs at once; 0 drains the pool.")
    idle_seconds: float = Field(300, gt=0, description="A worker that held no lease this long is drained and stopped.")
    register_seconds: float = Field(
        300, gt=0, description="A started worker that has not registered by then is stopped."
    )
    orphan_exit_seconds: float | None = Field(
        None,
        gt=0,
        description="A worker that cannot reach its server this long exits once it holds no job; unset: never waits, exits at once when orphaned and idle.",
    )
    compute: ComputeConfig = Field(default_factory=LocalCompute, description="Where the workers run.")
