"""What a caller may see of names: token names, roles and pools, and secret names, are an admin's to list
(`GET /v1/tokens`, `/v1/secrets`), so every other role gets them as `(hidden)` wherever they appear — events, the
inbox, `status`'s escalations, and the secrets a job's spec names. A token still sees its own name on its writes."""

from __future__ import annotations

from typing import Any

from piloop_common.protocol.operator import JobView
from piloop_server.auth import Caller, Role

HIDDEN = "(hidden)"
# the fields of events that name tokens and secrets
NAMING = {"token.": ("name", "names", "pool", "role"), "secret.": ("name",)}


def sees_names(caller: Caller) -> bool:
    return caller.role is not None and caller.role.reaches(Role.ADMIN)


def events(caller: Caller, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`events` as `caller` may see them: a token's name, role and pool, a secret's name, and another token that
    signed a write (`by: token:<name>`; the caller's own it sees) hidden from all but an admin."""
    if sees_names(caller):
        return events
    mine = caller.signed if caller.token is not None else None
    out = []
    for e in events:
        fields = next((f for prefix, f in NAMING.items() if str(e.get("type", "")).startswith(prefix)), ())
        by = e.get("by")
        other = isinstance(by, str) and by.startswith("token:") and by != mine
        if fields or other:
            e = {**e, **{f: HIDDEN for f in fields if f in e}}
            if other:
                e["by"] = f"token:{HIDDEN}"
        out.append(e)
    return out


def job(caller: Caller, view: JobView) -> JobView:
    """`view` as `caller` may see it: the secrets its spec names, by name, to an admin only (how many it names
    stays)."""
    named = view.spec.get("secrets")
    if sees_names(caller) or not named:
        return view
    return view.model_copy(update={"spec": {**view.spec, "secrets": [HIDDEN] * len(named)}})
