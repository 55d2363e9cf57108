"""The `modal` provider: each worker is a Modal Sandbox of an image with `piloop` in it.

`modal` is imported here only, and this module only when a pool uses it (`piloop-jobs[modal]` on the server, with
Modal's credentials). The sandbox runs `piloop worker --server URL --pool P` with its token in its environment,
carries the server's id as a tag (`Sandbox.list(tags=…)` finds ours, never another server's), and has a name
made from the server's id and the worker's, so a retried start never makes a second one.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from piloop_common.config.provisioner import ModalCompute
from piloop_server.provisioner.base import Handle, PlatformAuthError, StartRefused

TAG_SERVER, TAG_WORKER, TAG_POOL = "piloop-server", "piloop-worker", "piloop-pool"


class ModalProvider:
    def __init__(self, pool: str, compute: ModalCompute, *, url: str, tag: str) -> None:
        self.pool, self.compute, self.url, self.tag = pool, compute, url, tag
        self.modal: Any = importlib.import_module("modal")
        self.exc: Any = importlib.import_module("modal.exception")
        self._app: Any = None

    def _errors(self, e: Exception) -> Exception:
        """Modal's errors in piloop's words: a quota is a refusal (backoff), bad credentials stop the pool."""
        msg = f"modal: {e}"
        auth = tuple(getattr(self.exc, n) for n in ("AuthError", "PermissionDeniedError") if hasattr(self.exc, n))
        if isinstance(e, auth):
            return PlatformAuthError(msg)
        if isinstance(e, getattr(self.exc, "ResourceExhaustedError", ())):
            return StartRefused(msg)
        return e

    def app(self) -> Any:
        if self._app is None:
            self._app = self.modal.App.lookup(self.compute.app, create_if_missing=True)
        return self._app

    def image(self) -> Any:
        c, Image, Secret = self.compute, self.modal.Image, self.modal.Secret
        if c.registry is None:
            return Image.from_registry(c.image)
        pull = Secret.from_name(c.registry.secret)
        if c.registry.kind == "aws-ecr":
            return Image.from_aws_ecr(c.image, secret=pull)
        return Image.from_registry(c.image, secret=pull)

    def sandbox_name(self, name: str) -> str:
        return f"piloop-{self.tag}-{name}"

    def start(self, name: str, token: str | None, env: dict[str, str]) -> Handle:
        c = self.compute
        senv = {k: v for k, v in {**c.env, **env}.items() if k != "PILOOP_HTTPS_TOKEN"}
        if token:  # none on the proxy network: `env` holds the shared credential
            senv["PILOOP_HTTPS_TOKEN"] = token
        kwargs: dict[str, Any] = {
            "app": self.app(),
            "name": self.sandbox_name(name),
            "image": self.image(),
            "env": senv,
            "secrets": [self.modal.Secret.from_name(s) for s in c.secrets],
            "tags": {TAG_SERVER: self.tag, TAG_WORKER: name, TAG_POOL: self.pool},
            "timeout": c.timeout_seconds,
        }
        for key, value in (
            ("gpu", c.gpu),
            ("cpu", c.cpu),
            ("memory", c.memory_mb),
            ("idle_timeout", c.idle_timeout_seconds),
        ):
            if value is not None:
                kwargs[key] = value
        try:
            sb = self.modal.Sandbox.create(
                "piloop", "worker", "--server", self.url, "--pool", self.pool, "--name", name, **kwargs
            )
        except Exception as e:
            raise self._errors(e) from e
        return Handle(name, self.pool, sb.object_id)

    def stop(self, handle: Handle) -> None:
        try:
            self.modal.Sandbox.from_id(handle.id).terminate()
        except self.exc.NotFoundError:
            return  # already gone: stopped
        except Exception as e:
            raise self._errors(e) from e

    def list(self, tag: str) -> list[Handle]:
        try:
            found = list(self.modal.Sandbox.list(app_id=self.app().app_id, tags={TAG_SERVER: tag}))
        except Exception as e:
            raise self._errors(e) from e
        out = []
        for sb in found:
            tags = sb.get_tags()
            out.append(Handle(tags.get(TAG_WORKER, ""), tags.get(TAG_POOL, ""), sb.object_id))
        return out

    def unused_homes(self) -> dict[str, Path]:
        return {}  # a sandbox's disk goes with it
