"""A fake of the part of Modal's SDK that piloop's `modal` provider uses, for tests (put its parent on sys.path).

It records each call in `calls` (and, when FAKE_MODAL_LOG names a file, one JSON line per call there), and
FAKE_MODAL_MODE=quota|auth makes every `Sandbox.create` fail as Modal does on a quota or bad credentials.
"""

from __future__ import annotations

import itertools
import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from modal import exception

calls: list[tuple[str, tuple, dict]] = []
_ids = itertools.count(1)


def _record(what: str, args: tuple, kwargs: dict) -> None:
    calls.append((what, args, kwargs))
    path = os.environ.get("FAKE_MODAL_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"call": what, "args": list(args), "kwargs": kwargs}, default=_plain) + "\n")


def _plain(o: Any) -> Any:
    return asdict(o) if hasattr(o, "__dataclass_fields__") else repr(o)


@dataclass(frozen=True)
class Secret:
    name: str

    @staticmethod
    def from_name(name: str) -> Secret:
        return Secret(name)


@dataclass(frozen=True)
class Image:
    kind: str
    tag: str
    secret: Secret | None = None

    @staticmethod
    def from_registry(tag: str, secret: Secret | None = None) -> Image:
        return Image("registry", tag, secret)

    @staticmethod
    def from_aws_ecr(tag: str, secret: Secret) -> Image:
        return Image("aws-ecr", tag, secret)


@dataclass(frozen=True)
class App:
    name: str

    @property
    def app_id(self) -> str:
        return f"ap-{self.name}"

    @staticmethod
    def lookup(name: str, create_if_missing: bool = False) -> App:
        return App(name)


@dataclass
class Sandbox:
    object_id: str
    tags: dict[str, str] = field(default_factory=dict)
    app_id: str = ""

    live: ClassVar[dict[str, Any]] = {}  # object_id -> Sandbox: what the "platform" runs

    @staticmethod
    def create(*args: str, **kwargs: Any) -> Sandbox:
        mode = os.environ.get("FAKE_MODAL_MODE", "")
        if mode == "quota":
            raise exception.ResourceExhaustedError("no A100 is free in your workspace's quota")
        if mode == "auth":
            raise exception.AuthError("token is invalid or expired")
        _record("Sandbox.create", args, kwargs)
        sb = Sandbox(f"sb-{next(_ids)}", dict(kwargs.get("tags") or {}), kwargs["app"].app_id)
        Sandbox.live[sb.object_id] = sb
        return sb

    @staticmethod
    def from_id(object_id: str) -> Sandbox:
        if object_id not in Sandbox.live:
            raise exception.NotFoundError(f"sandbox {object_id} not found")
        return Sandbox.live[object_id]

    @staticmethod
    def list(*, app_id: str | None = None, tags: dict[str, str] | None = None):
        for sb in list(Sandbox.live.values()):
            if (app_id is None or sb.app_id == app_id) and all(sb.tags.get(k) == v for k, v in (tags or {}).items()):
                yield sb

    def get_tags(self) -> dict[str, str]:
        return dict(self.tags)

    def terminate(self) -> None:
        _record("Sandbox.terminate", (self.object_id,), {})
        Sandbox.live.pop(self.object_id, None)
