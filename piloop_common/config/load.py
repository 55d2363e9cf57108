"""Reading piloop's settings (`config.Settings`): the sources, later wins: the models' defaults,
`$PILOOP_HOME/config.toml`, `PILOOP_*` env (`PILOOP_REDIS_URL`, `PILOOP_NAMESPACE`, and `PILOOP_<SECTION>__<KEY>` for
any plugin key), then the `PILOOP_PLUGINS` JSON env. A wrong or unknown key is one `ConfigError` naming the source,
the key and what is allowed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from piloop_common.config.settings import CONFIG_FILE, Settings
from piloop_common.errors import ConfigError
from piloop_common.extras import requirement

ENV = "env"  # the source of the PILOOP_* variables; each value's own variable is in `Sources.origin`


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def _env_value(raw: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def _env_source(env: dict[str, str]) -> tuple[dict[str, Any], dict[tuple[str, ...], str]]:
    """The settings PILOOP_* env gives, and which variable gave each path."""
    data: dict[str, Any] = {}
    origin: dict[tuple[str, ...], str] = {}
    if env.get("PILOOP_NAMESPACE"):
        data["namespace"] = env["PILOOP_NAMESPACE"]
        origin[("namespace",)] = "env PILOOP_NAMESPACE"
    if env.get("PILOOP_REDIS_URL"):
        data = _deep_merge(data, {"plugins": {"state": {"url": env["PILOOP_REDIS_URL"]}}})
        origin[("plugins", "state", "url")] = "env PILOOP_REDIS_URL"
    for name in sorted(env):
        if not name.startswith("PILOOP_") or "__" not in name:
            continue
        path = tuple(p.lower() for p in name[len("PILOOP_") :].split("__"))
        node: dict[str, Any] = {}
        cur = node
        for p in path[:-1]:
            cur[p] = {}
            cur = cur[p]
        cur[path[-1]] = _env_value(env[name])
        data = _deep_merge(data, {"plugins": node})
        origin[("plugins", *path)] = f"env {name}"
    return data, origin


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        return {}
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}", source=str(path)) from e


def _has_path(data: dict[str, Any], loc: tuple[str, ...]) -> bool:
    cur: Any = data
    for p in loc:
        if not isinstance(cur, dict) or p not in cur:
            return False
        cur = cur[p]
    return True


def _allowed_keys(loc: tuple[str | int, ...]) -> list[str]:
    """The keys a table at `loc` accepts, for 'unknown key' errors."""
    model: Any = Settings
    in_dict = False
    for p in loc:
        if in_dict:  # a pool's name: the value type is the model
            in_dict = False
            continue
        field = getattr(model, "model_fields", {}).get(p) if model is not None else None
        if field is None:
            return []
        in_dict = getattr(field.annotation, "__origin__", None) is dict
        model = _model_of(field.annotation)
    return sorted(getattr(model, "model_fields", {}) or [])


def _model_of(ann: Any) -> Any:
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann
    for a in getattr(ann, "__args__", ()) or ():
        m = _model_of(a)
        if m is not None:
            return m
    meta = getattr(ann, "__origin__", None)
    return _model_of(meta) if meta not in (None, ann) else None


def _variable(loc: tuple[str, ...], origin: dict[tuple[str, ...], str]) -> str | None:
    """The env variable that gave `loc` or a table holding it (`env PILOOP_…`), if one did."""
    return next((origin[loc[:i]] for i in range(len(loc), 0, -1) if loc[:i] in origin), None)


@dataclass(frozen=True)
class Sources:
    """What `load_settings` merged, first to last (later wins): each source's name and data, and which env variable
    gave each path the env source holds."""

    home: Path
    file: Path
    layers: list[tuple[str, dict[str, Any]]]
    origin: dict[tuple[str, ...], str]

    def merged(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for _, data in self.layers:
            out = _deep_merge(out, data)
        return out

    def source_of(self, loc: tuple[str, ...]) -> str | None:
        """The last source that gives `loc` (`env PILOOP_…` for the env), or None when none does (a default)."""
        for name, data in reversed(self.layers):
            if _has_path(data, loc):
                return (_variable(loc, self.origin) or name) if name == ENV else name
        return None


def _describe(err: ErrorDetails, sources: Sources) -> str:
    loc = tuple(
        str(p) for p in err["loc"] if not (isinstance(p, str) and p in ("local", "s3", "http", "cached", "modal"))
    )
    key = ".".join(loc[1:] if loc and loc[0] == "plugins" else loc) or "(top level)"
    where = (
        _variable(loc, sources.origin) or sources.source_of(loc[:-1] if err["type"] == "missing" else loc) or "defaults"
    )
    if err["type"] == "extra_forbidden":
        allowed = _allowed_keys(tuple(loc[:-1]))
        hint = f"; allowed: {', '.join(allowed)}" if allowed else ""
        return f"{where}: {key}: unknown key{hint}"
    given = err.get("input")
    shown = "" if err["type"] == "missing" or isinstance(given, dict) else f" (given: {given!r})"
    return f"{where}: {key}: {err['msg']}{shown}"


def read_sources(home: Path | None = None, env: dict[str, str] | None = None, path: Path | None = None) -> Sources:
    """Every source's data, unvalidated; a ConfigError for a file that is not TOML or a PILOOP_PLUGINS not JSON."""
    env = dict(os.environ if env is None else env)
    home = Path(home or env.get("PILOOP_HOME") or Path.home() / ".piloop").expanduser()
    file = path or home / CONFIG_FILE
    file_data = _read_toml(file)
    env_data, origin = _env_source(env)
    plugins_json: dict[str, Any] = {}
    if env.get("PILOOP_PLUGINS"):
        try:
            parsed = json.loads(env["PILOOP_PLUGINS"])
        except ValueError as e:
            raise ConfigError(f"env PILOOP_PLUGINS: not valid JSON: {e}") from e
        if not isinstance(parsed, dict):
            raise ConfigError('env PILOOP_PLUGINS: must be a JSON object of plugin tables, like {"network": {...}}')
        plugins_json = {"plugins": parsed}
    layers = [(str(file), file_data), (ENV, env_data), ("env PILOOP_PLUGINS", plugins_json)]
    return Sources(home=home, file=file, layers=layers, origin=origin)


def settings_from(sources: Sources) -> Settings:
    """The sources validated into Settings; a ConfigError names what is wrong and where."""
    merged = sources.merged()
    if "home" in merged:
        raise ConfigError(f"{sources.file}: home: set PILOOP_HOME or --home, not a key in config.toml")
    try:
        settings = Settings(home=sources.home, **merged)
    except ValidationError as e:
        lines = [_describe(err, sources) for err in e.errors()]
        raise ConfigError("; ".join(lines), source=str(sources.file)) from None
    _check_extras(settings, sources)
    return settings


def load_settings(home: Path | None = None, env: dict[str, str] | None = None, path: Path | None = None) -> Settings:
    """Settings from every source; a ConfigError names what is wrong and where."""
    return settings_from(read_sources(home, env, path))


# a provider whose client library is an extra (the module, the extra): without it the pool's first start failed
# minutes later, in the task log only
PROVIDER_EXTRAS = {"modal": ("modal", requirement("modal")), "docker": ("docker", requirement("server"))}


def _check_extras(settings: Settings, sources: Sources) -> None:
    """A ConfigError naming the pool and the extra to install, for a provider whose library is not importable."""
    for name, pool in sorted(settings.executor.pools.items()):
        provider = pool.provisioner.compute.provider if pool.provisioner else ""
        if provider not in PROVIDER_EXTRAS:
            continue
        module, extra = PROVIDER_EXTRAS[provider]
        if importlib.util.find_spec(module) is not None:
            continue
        loc = ("plugins", "executor", "pools", name, "provisioner", "compute", "provider")
        where = sources.source_of(loc) or "defaults"
        raise ConfigError(
            f'{where}: executor.pools.{name}.provisioner.compute.provider = "{provider}" needs the {extra} extra, '
            f"which is not installed: pip install '{extra}'",
            source=str(where),
        )
