"""Limits: operator overrides of `[plugins.executor]` keys that win over config.toml from the next pass."""

from __future__ import annotations

import json
import time
from typing import Any

import redis
from pydantic import BaseModel, ValidationError

from piloop_common.config import ExecutorConfig
from piloop_common.errors import BadRequest, NotFound
from piloop_server.state.keys import Keys


def parse_value(raw: str) -> Any:
    """`1` → 1, `1.5` → 1.5, `true` → True, anything else stays a string."""
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def _set_path(data: dict[str, Any], path: list[str], value: Any) -> None:
    cur = data
    for p in path[:-1]:
        nxt = cur.get(p)
        if not isinstance(nxt, dict):
            raise KeyError(p)
        cur = nxt
    if path[-1] not in cur:
        raise KeyError(path[-1])
    cur[path[-1]] = value


def _check_path(model: type[BaseModel], data: dict[str, Any], path: list[str], key: str) -> None:
    """Refuse a key the schema does not have, naming what it does have."""
    cur_model: Any = model
    cur: Any = data
    for i, p in enumerate(path):
        if isinstance(cur_model, type) and issubclass(cur_model, BaseModel):
            fields = cur_model.model_fields
            if p not in fields:
                raise BadRequest(f"{key}: no such key; {'.'.join(['executor', *path[:i]])} has {', '.join(fields)}")
            ann = fields[p].annotation
            cur = cur.get(p) if isinstance(cur, dict) else None
            if p == "pools":
                cur_model = "pools"
            else:
                cur_model = _inner_model(ann)
            if cur is None and i < len(path) - 1:
                raise BadRequest(f"{key}: {'.'.join(['executor', *path[:i + 1]])} is not set in config.toml, so it has no keys to limit")
        elif cur_model == "pools":
            if not isinstance(cur, dict) or p not in cur:
                pools = ", ".join(sorted(cur or {})) or "none"
                raise BadRequest(f"{key}: no pool named {p} (pools: {pools})")
            cur = cur[p]
            from piloop_common.config import PoolConfig

            cur_model = PoolConfig
        else:
            raise BadRequest(f"{key}: {'.'.join(['executor', *path[:i]])} is a value, not a table")
    if isinstance(cur_model, type) and issubclass(cur_model, BaseModel) or cur_model == "pools":
        raise BadRequest(f"{key}: is a table; name one of its keys")


def _inner_model(ann: Any) -> Any:
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann
    for a in getattr(ann, "__args__", ()) or ():
        if isinstance(a, type) and issubclass(a, BaseModel):
            return a
    return None


class Limits:
    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.r = client
        self.k = keys

    def all(self) -> dict[str, dict[str, Any]]:
        return {k.decode(): json.loads(v) for k, v in self.r.hgetall(self.k.limits()).items()}

    @staticmethod
    def apply(base: ExecutorConfig, limits: dict[str, dict[str, Any]]) -> tuple[ExecutorConfig, list[str]]:
        """`base` with each limit that still fits the schema; the keys that no longer do."""
        data = base.model_dump()
        bad: list[str] = []
        for key, rec in sorted(limits.items()):
            trial = json.loads(json.dumps(data))
            try:
                _set_path(trial, key.split(".")[1:], rec["value"])
                ExecutorConfig.model_validate(trial)
            except (KeyError, ValidationError):
                bad.append(key)
                continue
            data = trial
        return ExecutorConfig.model_validate(data), bad

    def set(self, base: ExecutorConfig, key: str, raw: str | Any, reason: str, by: str) -> Any:
        if not reason.strip():
            raise BadRequest("--reason: say why (it is shown beside the limit in `piloop status`)")
        path = key.split(".")
        if path[0] != "executor" or len(path) < 2:
            raise BadRequest(f"{key}: limits set keys of [plugins.executor], like executor.pools.serve.evaluations")
        value = parse_value(raw) if isinstance(raw, str) else raw
        current, _ = self.apply(base, self.all())
        data = current.model_dump()
        _check_path(ExecutorConfig, data, path[1:], key)
        _set_path(data, path[1:], value)
        try:
            ExecutorConfig.model_validate(data)
        except ValidationError as e:
            msgs = "; ".join(f"{'.'.join(str(x) for x in err['loc']) or key}: {err['msg']}" for err in e.errors())
            raise BadRequest(f"{key} = {value!r} is refused: {msgs}") from None
        rec = {"value": value, "reason": reason, "by": by, "at_ms": int(time.time() * 1000)}
        self.r.hset(self.k.limits(), key, json.dumps(rec))
        return value

    def unset(self, key: str) -> None:
        if not self.r.hdel(self.k.limits(), key):
            raise NotFound(f"{key}: no limit is set (see `piloop limits list`)")
