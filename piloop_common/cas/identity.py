"""The identity object, `piloop-cas.json`: a random id written once per store.

Workers and the server compare ids to know they share one store, so the object is created
with a create-if-absent primitive (a hard link locally, a conditional put on S3) and never rewritten.
"""

from __future__ import annotations

import json
import secrets
import time

from piloop_common.errors import StoreError

NAME = "piloop-cas.json"


def new_document() -> bytes:
    doc = {"id": secrets.token_hex(16), "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    return json.dumps(doc).encode() + b"\n"


def id_from(data: bytes, where: str) -> str:
    """The id in an identity object, or `StoreError` naming where the bad object is."""
    try:
        value = json.loads(data)["id"]
    except (ValueError, KeyError, TypeError) as e:
        raise StoreError(f"the identity object {NAME} in {where} is not valid: {e}", where=where) from e
    if not isinstance(value, str) or not value:
        raise StoreError(f"the identity object {NAME} in {where} has no id", where=where)
    return value
