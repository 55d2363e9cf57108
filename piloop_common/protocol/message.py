"""What every message shares: `Message` (no unknown field, no NaN, no string Redis cannot hold) and the id
patterns a worker's names must match before they reach a Redis key."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator


def text_problem(data: Any, where: str = "") -> str:
    """Why `data` (a request's JSON, walked whole) cannot reach Redis: a string with a NUL or a lone surrogate (not
    UTF-8), a key or a value; '' when every string is clean."""
    if isinstance(data, str):
        if "\x00" in data:
            return f"{where or 'a string'}: a NUL character is refused"
        try:
            data.encode()
        except UnicodeEncodeError:
            return f"{where or 'a string'}: not valid UTF-8 (a lone surrogate)"
        return ""
    if isinstance(data, dict):
        for k, v in data.items():
            got = text_problem(k, f"{where}.{k!r}" if where else "a key") or text_problem(v, f"{where}.{k}".lstrip("."))
            if got:
                return got
    elif isinstance(data, (list, tuple)):
        for i, v in enumerate(data):
            if got := text_problem(v, f"{where}[{i}]"):
                return got
    return ""


class Message(BaseModel):
    """What every message shares: no field it does not know, no infinite or NaN number, and no string Redis could not
    hold as sent (`text_problem`)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _clean_text(cls, data: Any) -> Any:
        if isinstance(data, dict) and (why := text_problem(data)):
            raise ValueError(why)
        return data


# What a worker names reaches Redis keys: an id or token that could spell another key is refused at the door.
# never a key's `:` (`job:<id>:progress` is a job's notes), a hash tag's braces, a glob's `*` or a path's `/`
JOB_ID = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
JobId = Annotated[str, Field(pattern=JOB_ID, description="A job's id.")]
ReportId = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", description="A report's id.")]
LEASE_TOKEN = r"^[0-9][0-9a-f.]{0,127}$"
LeaseToken = Annotated[str, Field(pattern=LEASE_TOKEN, description="A lease's fencing token.")]
Address = Annotated[str, Field(pattern=r"^sha256:[0-9a-f]{64}$", description="A CAS address.")]
