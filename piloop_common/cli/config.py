"""`piloop config check|schema`: the settings in effect and where each came from; the schema of config.toml."""

from __future__ import annotations

import json

import click

from piloop_common.cli.output import emit_json, table
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
    where it came from: `default`, `config.toml`, or its variable (`env PILOOP_…`); secrets masked. An invalid
    config exits 2 with the line `piloop serve` would give, naming the key."""
    from piloop_common.configcheck import check
    from piloop_common.configload import read_sources, settings_from
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
    if as_json:
        emit_json(checked.as_json())
        return
    found = "" if checked.file_exists else " (absent: no value below comes from it)"
    click.echo(f"piloop: config valid\n home:        {checked.home}\n config.toml: {checked.file}{found}\n")
    rows = [[e.key, _shown(e.value), e.source] for e in checked.settings]
    click.echo(table(["KEY", "VALUE", "SOURCE"], rows))


def _shown(value: object) -> str:
    """A value as TOML writes it (a whole float as `5`, which TOML reads back the same), `unset` for none."""
    if value is None:
        return "unset"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return json.dumps(value, ensure_ascii=False)


@config.command("schema")
def config_schema() -> None:
    """Print the JSON Schema of config.toml, for editors.

    `piloop config schema > ~/.piloop/config.schema.json`, then `#:schema ./config.schema.json` as the first line of
    config.toml: taplo and Even Better TOML check and complete the file against it (docs/configuration.md)."""
    from piloop_common.configschema import schema

    click.echo(json.dumps(schema(), indent=2))
