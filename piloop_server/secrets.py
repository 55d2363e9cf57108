"""Secrets: values a job names and gets as env, kept in Redis encrypted with AES-GCM.

Each value is sealed with a random 96-bit nonce and its name as associated data (a ciphertext moved to
another name does not open). The 256-bit key is env `PILOOP_SECRET_KEY` (base64) or `$PILOOP_HOME/secret.key`
(base64, made 0600 on first use; a looser mode is refused). Redis holds, per name: the nonce, the
ciphertext, the key's id (a hash prefix, to say which key sealed it), who set it and when. Never the value.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
import os
import re
import stat
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import redis
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from piloop_common.errors import BadRequest, ConfigError, NotFound
from piloop_server.state.keys import Keys

log = logging.getLogger("piloop.secrets")

KEY_FILE = "secret.key"
KEY_ENV = "PILOOP_SECRET_KEY"
KEY_BYTES = 32
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
MAX_VALUE_BYTES = 64 * 1024


@dataclass
class SecretInfo:
    name: str
    created_ms: int
    updated_ms: int
    by: str
    key_id: str


def check_name(name: str) -> str:
    if not NAME.match(name or ""):
        raise BadRequest(f"secret name {name[:80]!r}: use letters, digits and _, not starting with a digit "
                         "(an environment variable's name), at most 128")
    return name


def check_value(name: str, value: str) -> str:
    if not value:
        raise BadRequest(f"secret {name}: the value is empty (give it on stdin: printf %s \"$V\" | piloop secret set {name})")
    if "\0" in value:
        raise BadRequest(f"secret {name}: the value holds a NUL byte, which an environment variable cannot carry")
    if len(value.encode()) > MAX_VALUE_BYTES:
        raise BadRequest(f"secret {name}: the value is over {MAX_VALUE_BYTES} bytes")
    return value


def key_id(key: bytes) -> str:
    return hashlib.sha256(b"piloop-secret-key:" + key).hexdigest()[:12]


def _decode_key(raw: str, where: str) -> bytes:
    try:
        # standard or URL-safe alphabet
        key = base64.b64decode(raw.strip().replace("-", "+").replace("_", "/"), validate=True)
    except (binascii.Error, ValueError) as e:
        raise ConfigError(f"{where}: not base64 ({e})") from None
    if len(key) != KEY_BYTES:
        raise ConfigError(f"{where}: the key is {len(key)} bytes; it must be {KEY_BYTES} (base64 of 32 random bytes, "
                          "like `head -c 32 /dev/urandom | base64`)")
    return key


class KeySource:
    """Where the key comes from; the file is checked at once (a looser mode is refused) and made on first use."""

    def __init__(self, home: Path, env: dict[str, str] | None = None) -> None:
        env = dict(os.environ if env is None else env)
        self.path = home / KEY_FILE
        self.env_value = env.get(KEY_ENV) or None
        self._key: bytes | None = None
        if self.env_value is not None:
            self._key = _decode_key(self.env_value, f"env {KEY_ENV}")
        else:
            self._check_file()

    def _check_file(self) -> bool:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return False
        if st.st_mode & 0o077:
            raise ConfigError(f"{self.path}: mode {stat.S_IMODE(st.st_mode):04o} lets others read the secret key; "
                              f"`chmod 600 {self.path}`")
        return True

    def existing(self) -> bytes | None:
        """The key if there is one, without making it."""
        if self._key is None and self._check_file():
            self._key = _decode_key(self.path.read_text(), str(self.path))
        return self._key

    def get(self) -> bytes:
        """The key, made (0600, never overwritten) when there is none yet."""
        key = self.existing()
        if key is not None:
            return key
        new = os.urandom(KEY_BYTES)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another process made it first: use theirs
            return self.existing() or self.get()
        with os.fdopen(fd, "w") as f:
            f.write(base64.b64encode(new).decode() + "\n")
            f.flush()
            os.fsync(f.fileno())
        log.info("event=secret.key_created path=%s key_id=%s", self.path, key_id(new))
        self._key = new
        return new


class Secrets:
    def __init__(self, client: redis.Redis, keys: Keys, home: Path, env: dict[str, str] | None = None) -> None:
        self.r = client
        self.k = keys
        self.source = KeySource(home, env)

    def set(self, name: str, value: str, by: str) -> tuple[SecretInfo, bool]:
        """Seal and store `value` under `name`; the record, and whether it replaced one."""
        check_value(check_name(name), value)
        key = self.source.get()
        nonce = os.urandom(12)
        sealed = AESGCM(key).encrypt(nonce, value.encode(), name.encode())
        now = int(time.time() * 1000)
        old = self._record(name)
        info = SecretInfo(name, old["created_ms"] if old else now, now, by, key_id(key))
        rec = {**asdict(info), "nonce": base64.b64encode(nonce).decode(), "sealed": base64.b64encode(sealed).decode()}
        self.r.hset(self.k.secrets(), name, json.dumps(rec))
        return info, old is not None

    def _record(self, name: str) -> dict | None:
        raw = self.r.hget(self.k.secrets(), name)
        return json.loads(raw) if raw else None

    def names(self) -> set[str]:
        return {n.decode() for n in self.r.hkeys(self.k.secrets())}

    def list(self) -> list[dict]:
        """Each secret's name, dates, who set it, and whether this server's key opens it; never a value."""
        current = self.source.existing()
        kid = key_id(current) if current else None
        out = []
        for raw in self.r.hvals(self.k.secrets()):
            rec = json.loads(raw)
            out.append({"name": rec["name"], "created_ms": rec["created_ms"], "updated_ms": rec["updated_ms"],
                        "by": rec["by"], "key_id": rec["key_id"], "readable": rec["key_id"] == kid})
        return sorted(out, key=lambda r: r["name"])

    def remove(self, name: str) -> None:
        if not self.r.hdel(self.k.secrets(), name):
            raise NotFound(f"no secret named {name} (see `piloop secret list`)")

    def values(self, names: list[str]) -> dict[str, str]:
        """The values of `names`, opened; a name that is gone or that this key cannot open is left out, logged."""
        if not names:
            return {}
        raws = self.r.hmget(self.k.secrets(), names)
        key = self.source.existing()
        out: dict[str, str] = {}
        for name, raw in zip(names, raws):
            if raw is None:
                log.warning("event=secret.missing name=%s (removed after the job was submitted)", name)
                continue
            rec = json.loads(raw)
            try:
                if key is None:
                    raise InvalidTag()
                out[name] = AESGCM(key).decrypt(base64.b64decode(rec["nonce"]), base64.b64decode(rec["sealed"]),
                                                name.encode()).decode()
            except (InvalidTag, ValueError, KeyError):
                log.error("event=secret.unreadable name=%s sealed_with=%s server_key=%s: set it again",
                          name, rec.get("key_id"), key_id(key) if key else "none")
        return out
