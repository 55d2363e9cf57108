"""The `docker` provider's compute: worker containers on a Docker host (`piloop_server/provisioner/docker.py`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from piloop_common.config.model import ConfigModel


class DockerCompute(ConfigModel):
    provider: Literal["docker"] = Field("docker", description="Workers as containers of `image` on a Docker host.")
    image: str = Field(description="The image with piloop in it (its `piloop` on PATH), as Docker names it.")
    pull: Literal["missing", "always", "never"] = Field(
        "missing",
        description="When the image is pulled: when the host lacks it, before every start, or never (a failed "
        "pull, or a missing image with `never`, is a refused start).",
    )
    docker_host: str | None = Field(
        None,
        description="The Docker daemon, like `tcp://build1:2376`; unset: `DOCKER_HOST` of the server's environment "
        "(with `DOCKER_TLS_VERIFY` and `DOCKER_CERT_PATH`), else the local socket.",
    )
    network: str | None = Field(
        None,
        description="The Docker network each container joins (`host`, or one from which the server's url is "
        "reached); unset: Docker's default bridge.",
    )
    cpus: float | None = Field(None, gt=0, description="CPUs per container (Docker's `--cpus`).")
    memory_mb: int | None = Field(None, gt=0, description="Memory limit per container, in MiB (`--memory`).")
    gpus: int | Literal["all"] | None = Field(
        None, description="GPUs per container through a device request (`--gpus`): a count, or `all`."
    )
    gpu_ids: list[str] = Field(
        default_factory=list, description="GPUs per container by id or UUID (`--gpus device=…`), instead of `gpus`."
    )
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment for each container.")
    volumes: list[str] = Field(
        default_factory=list,
        description="Bind mounts for each container, `HOST:CONTAINER[:ro]` (a cache the workers share, say).",
    )
    extra_hosts: dict[str, str] = Field(
        default_factory=dict,
        description='Extra /etc/hosts lines, like `{"piloop.internal" = "host-gateway"}` for the Docker host.',
    )

    @model_validator(mode="after")
    def _one_gpu_form(self) -> DockerCompute:
        if self.gpus is not None and self.gpu_ids:
            raise ValueError(f"give gpus ({self.gpus!r}) or gpu_ids ({self.gpu_ids!r}), not both")
        for v in self.volumes:
            parts = v.split(":")
            if (
                len(parts) not in (2, 3)
                or not parts[0].startswith("/")
                or not parts[1].startswith("/")
                or (len(parts) == 3 and parts[2] not in ("ro", "rw"))
            ):
                raise ValueError(f"volumes: {v!r} is not HOST:CONTAINER[:ro|rw] with absolute paths")
        return self
