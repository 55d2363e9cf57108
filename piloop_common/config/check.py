"""`piloop config check`: the effective settings, each with the source that gave it, and no secret shown.

Where a value came from is read off the models and the loader's own sources, not re-parsed: a field not in its
model's `model_fields_set` is its default; one that is was given by the last source (`load.Sources`) that
holds its path. What is masked: every `SecretStr` (the password of a URL in one, or the whole value), the password
of any URL, a URL's query values named like a secret, and the values of a table's keys named like one (a pool's
`env`)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, SecretStr

from piloop_common.config.load import Sources
from piloop_common.config.settings import CONFIG_FILE, Settings

DEFAULT = "default"
MASK = "**********"  # as pydantic shows a SecretStr
# a key whose value is a credential: a pool's `env = {AWS_SECRET_ACCESS_KEY = …}`, a URL's `?password=…`
SECRET_NAME = re.compile(r"secret|token|passw|credential|auth|(^|_)key($|_)|apikey|private", re.IGNORECASE)
_QUERY_PAIR = re.compile(r"([^&=;]+)=([^&;]*)")


@dataclass(frozen=True)
class Effective:
    """One setting as it is in effect: its key (dotted, as the loader's errors name it), its value (JSON-able,
    masked) and where it came from: `default`, `config.toml`, or the variable (`env PILOOP_…`)."""

    key: str
    value: Any
    source: str
    over: Effective | None = None  # under a limit (source `limit: REASON`): what the config gives


@dataclass(frozen=True)
class Checked:
    """A valid config: where it was read from, and every setting in effect."""

    home: Path
    file: Path
    file_exists: bool
    settings: list[Effective]

    def as_json(self) -> dict[str, Any]:
        return {
            "valid": True,
            "home": str(self.home),
            "file": str(self.file),
            "file_exists": self.file_exists,
            "settings": {e.key: _row(e) for e in self.settings},
        }


def _row(e: Effective) -> dict[str, Any]:
    if e.over is None:
        return {"value": e.value, "source": e.source}
    return {"value": e.value, "source": LIMIT, "reason": e.source.removeprefix(f"{LIMIT}: "), "over": _row(e.over)}


LIMIT = "limit"


def with_limits(checked: Checked, limits: dict[str, tuple[Any, str]]) -> Checked:
    """`checked` with each value a daemon's limit holds (key -> (value, reason)) in place of the config's: its source
    `limit: REASON`, and the config's value and source kept beside it (`over`)."""
    rows = [
        Effective(e.key, limits[e.key][0], f"{LIMIT}: {limits[e.key][1]}", over=e) if e.key in limits else e
        for e in checked.settings
    ]
    return Checked(home=checked.home, file=checked.file, file_exists=checked.file_exists, settings=rows)


def check(settings: Settings, sources: Sources) -> Checked:
    rows: list[Effective] = []
    _walk(settings, (), sources, rows)
    return Checked(home=sources.home, file=sources.file, file_exists=sources.file.exists(), settings=rows)


def _walk(model: BaseModel, loc: tuple[str, ...], sources: Sources, out: list[Effective]) -> None:
    for name in type(model).model_fields:
        if not loc and name == "home":  # PILOOP_HOME or --home, never a key of the file: shown apart
            continue
        value = getattr(model, name)
        path = (*loc, name)
        if isinstance(value, BaseModel):
            _walk(value, path, sources, out)
        elif isinstance(value, dict) and value and all(isinstance(v, BaseModel) for v in value.values()):
            for key, item in value.items():  # tables by name (the pools)
                _walk(item, (*path, key), sources, out)
        else:
            given = sources.source_of(path) if name in model.model_fields_set else None
            out.append(Effective(_key(path), masked(value), _label(given, sources)))


def _key(path: tuple[str, ...]) -> str:
    return ".".join(path[1:] if path[0] == "plugins" else path)


def _label(source: str | None, sources: Sources) -> str:
    if source is None:
        return DEFAULT
    return CONFIG_FILE if source == str(sources.file) else source


def masked(value: Any) -> Any:
    """`value` as JSON-able data with no secret in it."""
    if isinstance(value, SecretStr):
        raw = value.get_secret_value()
        shown = mask_url(raw)
        return shown if shown is not None else MASK
    if isinstance(value, str):
        shown = mask_url(value)
        return value if shown is None else shown
    if isinstance(value, BaseModel):
        return masked(value.model_dump(mode="json"))  # pydantic masks its SecretStr fields itself
    if isinstance(value, dict):
        return {
            str(k): MASK if SECRET_NAME.search(str(k)) and isinstance(v, str) and v else masked(v)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [masked(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def mask_url(raw: str) -> str | None:
    """`raw` with its URL's password and secret-named query values masked; None when it is not a URL."""
    scheme, sep, rest = raw.partition("://")
    if not sep or not scheme.replace("+", "").replace("-", "").replace(".", "").isalnum():
        return None
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    authority, tail = rest[:end], rest[end:]
    userinfo, at, hostport = authority.rpartition("@")
    if at and ":" in userinfo:
        authority = f"{userinfo.partition(':')[0]}:{MASK}@{hostport}"
    path, q, query = tail.partition("?")
    if q:
        query = _QUERY_PAIR.sub(lambda m: f"{m[1]}={MASK}" if SECRET_NAME.search(m[1]) else m[0], query)
    return f"{scheme}://{authority}{path}{q}{query}"
