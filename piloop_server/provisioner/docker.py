"""The `docker` provider: each worker is a container of an image with `piloop` in it, on a Docker host.

Through the Docker SDK for Python (`docker`, imported here only, and this module only when a pool uses it). The
container runs `piloop worker --server URL --pool P --name <name>` as its entrypoint's command, with its own token
in its environment, and carries three labels: `piloop.server` (the server's id: the tag; listing filters on it, so
two servers on one host never see, nor stop, each other's containers), `piloop.worker` and `piloop.pool`. Its name,
`piloop-<server id>-<worker>`, is deterministic: a retried start replaces the container of the try before, which
holds a revoked token.

A container that exited (an orphaned worker that left by itself, a worker refused by the server) is removed by the
next listing, its last log lines kept in the server's log, and so its record is found lost.
"""

from __future__ import annotations

import importlib
import logging
import os
from pathlib import Path
from typing import Any

from piloop_common.config.docker import DockerCompute
from piloop_server.provisioner.base import Handle, PlatformAuthError, StartRefused
from piloop_server.provisioner.local import _plugins

log = logging.getLogger("piloop.provisioner")

LABEL_SERVER, LABEL_WORKER, LABEL_POOL = "piloop.server", "piloop.worker", "piloop.pool"
STOP_GRACE_SECONDS = 10  # SIGTERM (the worker sends its ready reports and detaches), then SIGKILL
API_TIMEOUT_SECONDS = 60  # one call to the Docker daemon; a pull may take many
LIVE = ("created", "running", "restarting", "paused")  # an `exited` or `dead` container never runs a worker again
LOG_TAIL_LINES = 20


class DockerProvider:
    def __init__(self, pool: str, compute: DockerCompute, *, url: str, tag: str, cas_plugins: dict[str, Any]) -> None:
        self.pool, self.compute, self.url, self.tag, self.cas_plugins = pool, compute, url, tag, cas_plugins
        self.docker: Any = importlib.import_module("docker")
        self.errors: Any = importlib.import_module("docker.errors")
        self.types: Any = importlib.import_module("docker.types")
        self._client: Any = None

    def client(self) -> Any:
        if self._client is None:
            env = dict(os.environ)
            if self.compute.docker_host:
                env["DOCKER_HOST"] = self.compute.docker_host
            try:
                self._client = self.docker.from_env(environment=env, timeout=API_TIMEOUT_SECONDS)
            except self.errors.DockerException as e:
                raise StartRefused(f"docker: cannot reach the Docker daemon: {e}") from e
        return self._client

    def _errors(self, e: Exception, what: str) -> Exception:
        """Docker's errors in piloop's words: refused credentials stop the pool, anything else is a refusal."""
        status = getattr(getattr(e, "response", None), "status_code", None)
        explanation = getattr(e, "explanation", None) or str(e)
        msg = f"docker: {what}: {explanation}"
        if status in (401, 403) and not isinstance(e, self.errors.ImageNotFound):
            return PlatformAuthError(msg)
        return StartRefused(msg)

    def container_name(self, name: str) -> str:
        return f"piloop-{self.tag}-{name}"

    def _image(self) -> None:
        """The image on the host, pulled as `pull` says; a failed pull is a refused start."""
        c, images = self.compute, self.client().images
        if c.pull != "always":
            try:
                images.get(c.image)
                return
            except self.errors.ImageNotFound:
                if c.pull == "never":
                    raise StartRefused(f"docker: image {c.image} is not on the host, and pull = never") from None
        # by digest, by tag, else `latest`: never no tag, which the SDK reads as every tag of the repository
        last = c.image.rsplit("/", 1)[-1]
        repo = c.image
        tag: str | None = "latest"
        if "@" in last:
            tag = None
        elif ":" in last:
            repo, _, tag = c.image.rpartition(":")
        try:
            images.pull(repo, tag=tag)
        except self.errors.DockerException as e:
            raise self._errors(e, f"cannot pull {c.image}") from e

    def _run_kwargs(self, name: str, token: str | None, env: dict[str, str]) -> dict[str, Any]:
        c = self.compute
        cenv = {k: v for k, v in {**c.env, **env}.items() if k != "PILOOP_HTTPS_TOKEN"}
        cenv["PILOOP_PLUGINS"] = _plugins(self.cas_plugins, c.env)
        if token:  # none on the proxy network: `env` holds the shared credential
            cenv["PILOOP_HTTPS_TOKEN"] = token
        kw: dict[str, Any] = {
            "image": c.image,
            "entrypoint": ["piloop"],
            "command": ["worker", "--server", self.url, "--pool", self.pool, "--name", name],
            "name": self.container_name(name),
            "labels": {LABEL_SERVER: self.tag, LABEL_WORKER: name, LABEL_POOL: self.pool},
            "environment": cenv,
            "detach": True,
            "init": True,  # tini as PID 1: it forwards SIGTERM to the worker and reaps its jobs' orphans
            "restart_policy": {"Name": "no"},
        }
        if c.network:
            kw["network"] = c.network
        if c.cpus is not None:
            kw["nano_cpus"] = int(c.cpus * 1e9)
        if c.memory_mb is not None:
            kw["mem_limit"] = f"{c.memory_mb}m"
        if c.gpus is not None or c.gpu_ids:
            count = -1 if c.gpus == "all" else (c.gpus if isinstance(c.gpus, int) else None)
            kw["device_requests"] = [
                self.types.DeviceRequest(count=count, device_ids=c.gpu_ids or None, capabilities=[["gpu"]])
            ]
        if c.volumes:
            kw["volumes"] = list(c.volumes)
        if c.extra_hosts:
            kw["extra_hosts"] = dict(c.extra_hosts)
        return kw

    def start(self, name: str, token: str | None, env: dict[str, str]) -> Handle:
        kw = self._run_kwargs(name, token, env)
        self._image()
        containers = self.client().containers
        try:
            containers.get(kw["name"]).remove(force=True)  # a retried start: the try before's token is revoked
        except self.errors.NotFound:
            pass
        except self.errors.DockerException as e:
            raise self._errors(e, f"cannot remove the container of a start before, {kw['name']}") from e
        try:
            container = containers.run(**kw)
        except self.errors.DockerException as e:
            # created but not started (no GPU driver, a bad mount): nothing of it may linger under our tag
            try:
                containers.get(kw["name"]).remove(force=True)
            except self.errors.DockerException:
                pass
            raise self._errors(e, f"cannot start {kw['name']} of {self.compute.image}") from e
        return Handle(name, self.pool, container.id)

    def stop(self, handle: Handle) -> None:
        try:
            container = self.client().containers.get(handle.id)
        except self.errors.NotFound:
            return  # already gone: stopped
        except self.errors.DockerException as e:
            raise self._errors(e, f"cannot find {handle.id[:12]}") from e
        try:
            if container.status in LIVE:
                container.stop(timeout=STOP_GRACE_SECONDS)
            container.remove(force=True)
        except self.errors.NotFound:
            return
        except self.errors.DockerException as e:
            raise self._errors(e, f"cannot stop {handle.id[:12]}") from e

    def list(self, tag: str) -> list[Handle]:
        try:
            found = self.client().containers.list(all=True, filters={"label": f"{LABEL_SERVER}={tag}"})
        except self.errors.DockerException as e:
            raise self._errors(e, "cannot list containers") from e
        out = []
        for c in found:
            labels = c.labels or {}
            if labels.get(LABEL_SERVER) != tag:
                continue
            if c.status in LIVE:
                out.append(Handle(labels.get(LABEL_WORKER, ""), labels.get(LABEL_POOL, ""), c.id))
            else:
                self._remove_exited(c, labels)
        return out

    def _remove_exited(self, c: Any, labels: dict[str, str]) -> None:
        """An exited container of ours never runs again: its log's tail to the server's log, then removed."""
        try:
            tail = c.logs(tail=LOG_TAIL_LINES).decode(errors="replace").strip()
            code = (c.attrs.get("State") or {}).get("ExitCode")
            c.remove(force=True)
        except self.errors.DockerException:
            return  # the next listing tries again
        log.info(
            "event=provisioner.container_exited worker=%s id=%s exit=%s tail=%r",
            labels.get(LABEL_WORKER, ""),
            c.id[:12],
            code,
            tail[-2000:],
        )

    def unused_homes(self) -> dict[str, Path]:
        return {}  # a container's home goes with it
