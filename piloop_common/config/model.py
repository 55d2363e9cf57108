"""The base of every config section's model: unknown keys and wrong types are refused, at load and on assignment."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ConfigModel(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)
