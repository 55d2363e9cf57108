"""A campaign's shared workspace as a manifest in the CAS: `{relative path: blob address}`.

The server makes the first manifest from `--workspace DIR`; an agent gets a copy of its files; when it ends the
worker sends only its writes (`{path: address, or None for a file it deleted}`), and the server folds them into
the next manifest. Blobs are shared by address, so an unchanged file is stored and fetched once.
"""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath
from typing import Any

from piloop_common.cas import Store
from piloop_common.cas.address import hash_file

Manifest = dict[str, str]
Changes = dict[str, str | None]


def safe_path(rel: str) -> bool:
    p = PurePosixPath(rel)
    return bool(rel) and not p.is_absolute() and ".." not in p.parts and "\\" not in rel and "\x00" not in rel


def files(root: Path) -> dict[str, Path]:
    """Every regular file under root by its posix relative path (symlinks are not followed or kept)."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and not p.is_symlink():
            out[p.relative_to(root).as_posix()] = p
    return out


def snapshot(root: Path, store: Store) -> Manifest:
    return {rel: store.put_file(p) for rel, p in files(root).items()}


def save(manifest: Manifest | Changes, store: Store) -> str:
    return store.put_bytes(json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode())


def load(address: str | None, store: Store) -> dict[str, Any]:
    if not address:
        return {}
    data = json.loads(store.get_bytes(address))
    if not isinstance(data, dict) or not all(isinstance(k, str) and safe_path(k) for k in data):
        raise ValueError(f"workspace manifest {address} is not a map of relative paths")
    return data


def materialize(manifest: Manifest, store: Store, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for rel, addr in manifest.items():
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        store.get_file(addr, target)


def changes(manifest: Manifest, root: Path, store: Store) -> Changes:
    """What the job wrote under root since it got `manifest`: new or changed files stored, deleted ones None."""
    now = files(root)
    out: Changes = {}
    for rel, p in now.items():
        if manifest.get(rel) != hash_file(p):
            out[rel] = store.put_file(p)
    for rel in manifest.keys() - now.keys():
        out[rel] = None
    return out


def merge(manifest: Manifest, writes: Changes) -> Manifest:
    out = dict(manifest)
    for rel, addr in writes.items():
        if not safe_path(rel):
            continue
        if addr is None:
            out.pop(rel, None)
        else:
            out[rel] = addr
    return out
