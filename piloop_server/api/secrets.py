"""Secrets: set, list, remove, and a new key for all of them. For those who act only: a worker gets a job's secrets in its claim answer."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from piloop_server.api.deps import AdminDep, RuntimeDep

router = APIRouter(prefix="/v1/secrets", tags=["secrets"])


class SecretSet(BaseModel):
    model_config = ConfigDict(extra="forbid")
    value: str = Field(description="The value, as the job's environment gets it.")


class SecretView(BaseModel):
    name: str
    created_ms: int
    updated_ms: int
    by: str
    key_id: str = Field(description="Which key sealed it (a hash prefix of the key).")
    readable: bool = Field(description="Whether this server's key opens it.")


@router.get("", response_model=list[SecretView])
def secret_list(rt: RuntimeDep, caller: AdminDep) -> list[SecretView]:
    return [SecretView(**r) for r in rt.secrets.every()]


class Rotated(BaseModel):
    resealed: int = Field(description="Secrets now sealed with the new key.")
    left: int = Field(description="Secrets no key of this server opens, left as they were.")
    key_id: str = Field(description="The new key's id.")


@router.post("/rotate-key", response_model=Rotated)
def secret_rotate_key(rt: RuntimeDep, caller: AdminDep) -> Rotated:
    done = rt.secrets.rotate_key()
    rt.events.add("secret.key_rotated", caller.signed, key_id=done.key_id, resealed=done.resealed, left=done.left)
    return Rotated(resealed=done.resealed, left=done.left, key_id=done.key_id)


@router.put("/{name}")
def secret_set(name: str, body: SecretSet, rt: RuntimeDep, caller: AdminDep) -> dict[str, Any]:
    info, replaced = rt.secrets.put(name, body.value, caller.signed)
    rt.events.add("secret.set", caller.signed, name=name, replaced=replaced)
    return {"name": info.name, "replaced": replaced, "updated_ms": info.updated_ms, "by": info.by}


@router.delete("/{name}")
def secret_remove(name: str, rt: RuntimeDep, caller: AdminDep) -> dict[str, str]:
    rt.secrets.remove(name)
    rt.events.add("secret.removed", caller.signed, name=name)
    return {"name": name}
