"""Limits: operator overrides of `[plugins.executor]` keys that win over config.toml from the next pass.

A limit's value is checked strictly against its key's field (a boolean is no number, nor is a string; a negative
is refused where the field forbids it) when it is set and each time it is applied. The timing keys are not
limits: the lease engine and the workers it registered must agree on them, so they come from config.toml only
(docs/faults.md, "Timings are fixed at start").
"""

from __future__ import annotations

import copy
import json
import time
import types
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo

from piloop_common.config.settings import ExecutorConfig
from piloop_common.errors import BadRequest, NotFound
from piloop_common.protocol.operator import LimitView
from piloop_server.state.connection import Client
from piloop_server.state.keys import Keys
from piloop_server.state.limits import LimitsState
from piloop_server.state.records.limit import Limit

TIMING_KEYS = frozenset(
    {
        "renew_seconds",
        "grace_seconds",
        "toleration_seconds",
        "request_timeout_seconds",
        "kill_grace_seconds",
        "pass_seconds",
        "max_lost",
    }
)
EXAMPLE = "executor.pools.serve.evaluations"


def _models(ann: Any) -> list[type[BaseModel]]:
    """The models a field holds directly (a model, an optional one, a union of them)."""
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return [ann]
    if get_origin(ann) in (Union, types.UnionType):
        return [m for a in get_args(ann) for m in _models(a)]
    return []


def _entry_model(ann: Any) -> type[BaseModel] | None:
    """M for a `dict[str, M]` field (the pools), else None."""
    if get_origin(ann) is dict:
        models = _models(get_args(ann)[1])
        return models[0] if models else None
    return None


def _choose(models: list[type[BaseModel]], data: Any) -> type[BaseModel]:
    """The member of a union that `data` is (by its `provider`, the config's discriminator)."""
    for m in models:
        f = m.model_fields.get("provider")
        if len(models) > 1 and f is not None and isinstance(data, dict) and f.default == data.get("provider"):
            return m
    return models[0]


def leaf(data: dict[str, Any], key: str) -> FieldInfo:
    """The field `key` names in the executor's schema, walking the current values `data` (a pool must exist, a
    table be set); BadRequest naming the key and what is there when it names no field, a table, or a timing."""
    path = key.split(".")
    if path[0] != "executor" or len(path) < 2:
        raise BadRequest(f"{key}: limits set keys of [plugins.executor], like {EXAMPLE}")
    if path[1] in TIMING_KEYS:
        raise BadRequest(
            f"{key}: a timing cannot be a limit (the lease engine and its workers must agree on it): "
            f"edit {path[1]} in config.toml's [plugins.executor] and restart `piloop serve`"
        )
    model: type[BaseModel] = ExecutorConfig
    cur: Any = data
    i = 1
    while True:
        here, part = ".".join(path[:i]), path[i]
        if part not in model.model_fields:
            raise BadRequest(f"{key}: no such key; {here} has {', '.join(model.model_fields)}")
        field = model.model_fields[part]
        models, entry = _models(field.annotation), _entry_model(field.annotation)
        cur = cur.get(part) if isinstance(cur, dict) else None
        i += 1
        if i == len(path):
            if models or entry:
                raise BadRequest(f"{key}: is a table; name one of its keys")
            return field
        if cur is None:
            raise BadRequest(f"{key}: {here}.{part} is not set in config.toml, so it has no keys to limit")
        if entry is not None:
            name = path[i]
            if name not in cur:
                raise BadRequest(f"{key}: {here}.{part} has no {name} ({', '.join(sorted(cur)) or 'none'})")
            cur, model, i = cur[name], entry, i + 1
            if i == len(path):
                raise BadRequest(f"{key}: is a table; name one of its keys")
            continue
        if not models:
            raise BadRequest(f"{key}: {here}.{part} is a value, not a table")
        model = _choose(models, cur)


def _json(raw: str) -> tuple[bool, Any]:
    """(True, the value) when `raw` is JSON (NaN and Infinity are not), else (False, None)."""

    def refuse(name: str) -> Any:
        raise ValueError(name)

    try:
        return True, json.loads(raw, parse_constant=refuse)
    except ValueError:
        return False, None


def typed(field: FieldInfo, key: str, value: Any) -> Any:
    """`value` as `field` takes it, strictly: from the CLI a string, read as JSON first (`1`, `1.5`, `null`,
    `["process"]`) and as the bare string when that does not fit; BadRequest naming the key otherwise."""
    adapter: TypeAdapter[Any] = TypeAdapter(field.rebuild_annotation())  # the type with its constraints
    tries = [value]
    if isinstance(value, str):
        is_json, parsed = _json(value)
        tries = [parsed, value] if is_json else [value]
    first: ValidationError | None = None
    for v in tries:
        try:
            return adapter.dump_python(adapter.validate_python(v, strict=True), mode="json")
        except ValidationError as e:
            first = first or e
    assert first is not None
    msg = first.errors()[0]["msg"]
    raise BadRequest(f"{key} = {value!r} is refused: {msg[:1].lower()}{msg[1:]}")


def _assign(data: dict[str, Any], key: str, value: Any) -> None:
    cur = data
    for p in key.split(".")[1:-1]:
        cur = cur[p]
    cur[key.rsplit(".", 1)[1]] = value


def _with(data: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    """`data` with the limit `key` = `value`, checked against the whole schema (its cross-field rules too)."""
    value = typed(leaf(data, key), key, value)
    trial = copy.deepcopy(data)
    _assign(trial, key, value)
    try:
        ExecutorConfig.model_validate(trial)
    except ValidationError as e:
        msgs = "; ".join(f"{'.'.join(str(x) for x in err['loc']) or key}: {err['msg']}" for err in e.errors())
        raise BadRequest(f"{key} = {value!r} is refused: {msgs}") from None
    return trial


class Limits:
    def __init__(self, client: Client, keys: Keys) -> None:
        self.r = client
        self.k = keys
        self.stored = LimitsState(client, keys)

    def all(self) -> dict[str, Limit]:
        return self.stored.every()

    def views(self) -> list[LimitView]:
        return [
            LimitView(key=k, value=v.value, reason=v.reason, by=v.by, at_ms=v.at_ms)
            for k, v in sorted(self.all().items())
        ]

    @staticmethod
    def apply(base: ExecutorConfig, limits: dict[str, Limit]) -> tuple[ExecutorConfig, list[str]]:
        """`base` with each limit that still fits the schema (never a timing); the keys that do not."""
        data = base.model_dump()
        bad: list[str] = []
        for key, rec in sorted(limits.items()):
            try:
                data = _with(data, key, rec.value)
            except BadRequest:
                bad.append(key)
        return ExecutorConfig.model_validate(data), bad

    def set(self, base: ExecutorConfig, key: str, raw: Any, reason: str, by: str) -> Any:
        """Store the limit `key` = `raw` over `base` and the limits already set; the value as stored."""
        if not reason.strip():
            raise BadRequest("--reason: say why (it is shown beside the limit in `piloop status`)")
        current, _ = self.apply(base, self.all())
        data = _with(current.model_dump(), key, raw)
        value = data
        for p in key.split(".")[1:]:
            value = value[p]
        self.stored.put(key, Limit(value, reason, by, int(time.time() * 1000)))
        return value

    def unset(self, key: str) -> None:
        if not self.stored.remove(key):
            raise NotFound(f"{key}: no limit is set (see `piloop limits list`)")
