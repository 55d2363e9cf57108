"""`piloop config schema`: the JSON Schema of `config.toml`, read off the models (`Settings.model_json_schema()`),
for editors that check TOML against one (taplo, VS Code's Even Better TOML: a `#:schema <path>` first line)."""

from __future__ import annotations

from typing import Any

from piloop_common import __version__
from piloop_common.config.settings import Settings

DRAFT = "https://json-schema.org/draft/2020-12/schema"


def schema() -> dict[str, Any]:
    """The schema of the file: `Settings` less `home`, which is `$PILOOP_HOME` (or `--home`), never a key."""
    out = Settings.model_json_schema()
    out["properties"].pop("home")
    required = [k for k in out.get("required", []) if k != "home"]
    if required:
        out["required"] = required
    else:
        out.pop("required", None)
    out["title"] = "piloop config.toml"
    out["description"] = (
        f"piloop {__version__}'s $PILOOP_HOME/config.toml (docs/configuration.md); printed by `piloop config schema`."
    )
    return {"$schema": DRAFT, **out}
