"""`piloop config check|schema`: the settings in effect and where each came from; the schema of config.toml."""

from __future__ import annotations

import json
from typing import Any

import click

from piloop_common.cli.output import emit_json, table, value_text
from piloop_common.errors import ConfigError


@click.group()
def config() -> None:
    """The config: check it as `piloop serve` reads it, or print its JSON Schema for an editor."""


@config.command("check")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (key -> value and source).")
@click.pass_obj
def config_check(obj, as_json: bool) -> None:
    """Validate the config and show each setting's source.

    Reads config.toml and the PILOOP_* environment as `piloop serve` does, and prints every setting in effect with
    where it came from: `default`, `config.toml`, its variable (`env PILOOP_…`), or a limit the running daemon holds
    (`limit: REASON`, with the value it holds over); secrets masked. An invalid config exits 2 with the line
    `piloop serve` would give, naming the key."""
    from piloop_common.config.check import check, with_limits
    from piloop_common.config.load import read_sources, settings_from
    from piloop_common.listen import serve_listen

    try:
        sources = read_sources(obj.home)
        settings = settings_from(sources)
        serve_listen(settings)  # as `piloop serve` checks it, beside the models' own checks
        checked = check(settings, sources)
    except ConfigError as e:
        if as_json:
            emit_json({"valid": False, "error": e.message})
        raise
    limits, said = _limits(obj)
    checked = with_limits(checked, limits)
    if as_json:
        emit_json({**checked.as_json(), "limits_read": not said})
        return
    found = "" if checked.file_exists else " (absent: no value below comes from it)"
    click.echo(f"piloop: config valid\n home:        {checked.home}\n config.toml: {checked.file}{found}\n")
    rows = [[e.key, _shown(e.value), _source(e)] for e in checked.settings]
    click.echo(table(["KEY", "VALUE", "SOURCE"], rows))
    if said:
        click.echo(f"\n{said}")


def _source(e: Any) -> str:
    return e.source if e.over is None else f"{e.source} (over {e.over.source}: {_shown(e.over.value)})"


def _limits(obj: Any) -> tuple[dict[str, tuple[Any, str]], str]:
    """The limits the local daemon holds (key -> (value, reason)), and '' — or none, and why they were not read."""
    from piloop_common.errors import PiloopError

    try:
        with obj.local_api(timeout=5) as api:
            got = api.call("GET", "/v1/limits")
    except PiloopError as e:
        return {}, f"limits: not read ({e.message.splitlines()[0][:160]}); a limit of a running daemon wins over these"
    return {g["key"]: (g["value"], g["reason"]) for g in got}, ""


def _shown(value: object) -> str:
    """A value as TOML writes it (a whole float as `5`, which TOML reads back the same), `unset` for none."""
    if value is None:
        return "unset"
    return value_text(value) if not isinstance(value, str) else json.dumps(value, ensure_ascii=False)


@config.command("schema")
def config_schema() -> None:
    """Print the JSON Schema of config.toml, for editors.

    `piloop config schema > ~/.piloop/config.schema.json`, then `#:schema ./config.schema.json` as the first line of
    config.toml: taplo and Even Better TOML check and complete the file against it (docs/configuration.md)."""
    from piloop_common.config.schema import schema

    click.echo(json.dumps(schema(), indent=2))
