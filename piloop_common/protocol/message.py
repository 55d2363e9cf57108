"""What every message shares: `Message` (no unknown field, no NaN, no string Redis cannot hold) and the id
patterns a worker's names must match before they reach a Redis key."""

from __future__ import annotations

import json
from contextvars import ContextVar
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ModelWrapValidatorHandler, model_validator


def text_problem(data: Any, where: str = "") -> str:
    """Why `data` (a request's JSON, walked whole) cannot reach Redis: a string with a NUL or a lone surrogate (not
    UTF-8), a key or a value; '' when every string is clean."""
    return "" if _clean(data) else _walk(data, where)


def _walk(data: Any, where: str) -> str:
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
            got = _walk(k, f"{where}.{k!r}" if where else "a key") or _walk(v, f"{where}.{k}".lstrip("."))
            if got:
                return got
    elif isinstance(data, (list, tuple)):
        for i, v in enumerate(data):
            if got := _walk(v, f"{where}[{i}]"):
                return got
    return ""


def _clean(data: Any) -> bool:
    """True when `data` has no NUL and no lone surrogate, told by one pass in C (`json.dumps` writes a NUL as
    `\\u0000` and keeps a surrogate, which `encode` refuses); False when it may have one: `text_problem`'s walk
    then says where."""
    try:
        dumped = json.dumps(data, ensure_ascii=False)
        dumped.encode()
    except (TypeError, ValueError):  # a surrogate (UnicodeEncodeError), or not JSON's types: the walk decides
        return False
    return "\\u0000" not in dumped


_CHECKED: ContextVar[bool] = ContextVar("piloop_message_text_checked", default=False)  # an outer message checked


class Message(BaseModel):
    """What every message shares: no field it does not know, no infinite or NaN number, and no string Redis could not
    hold as sent (`text_problem`)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @model_validator(mode="wrap")
    @classmethod
    def _clean_text(cls, data: Any, handler: ModelWrapValidatorHandler[Message]) -> Message:
        # the outermost message checks its whole input once; the messages nested in it are validated inside
        # `handler`, and skip it (each one checking its part again cost two thirds of a report batch's validation)
        if _CHECKED.get() or not isinstance(data, dict):
            return handler(data)
        if why := text_problem(data):
            raise ValueError(why)
        token = _CHECKED.set(True)
        try:
            return handler(data)
        finally:
            _CHECKED.reset(token)


# What a worker names reaches Redis keys: an id or token that could spell another key is refused at the door.
# never a key's `:` (`job:<id>:progress` is a job's notes), a hash tag's braces, a glob's `*` or a path's `/`
JOB_ID = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
JobId = Annotated[str, Field(pattern=JOB_ID, description="A job's id.")]
ReportId = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", description="A report's id.")]
LEASE_TOKEN = r"^[0-9][0-9a-f.]{0,127}$"
LeaseToken = Annotated[str, Field(pattern=LEASE_TOKEN, description="A lease's fencing token.")]
Address = Annotated[str, Field(pattern=r"^sha256:[0-9a-f]{64}$", description="A CAS address.")]
