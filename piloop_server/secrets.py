"""Secrets: values a job names and gets as env, kept in Redis encrypted with AES-GCM.

Each value is sealed with a random 96-bit nonce and its name as associated data (a ciphertext moved to
another name does not open). The 256-bit key is env `PILOOP_SECRET_KEY` (base64) or `$PILOOP_HOME/secret.key`
(base64, made 0600 on first use; a looser mode, another length or a file that is not base64 is refused). Redis
holds, per name, a `SecretRecord` (`state/records/secret.py`): the nonce, the ciphertext, the key's id (a hash
prefix, to say which key sealed it), who set it and when. Never the value. The records are read and written
through `state/secrets.py`; the crypto and the policy (names, sizes, which key) are here.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import os
import stat
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypedDict

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from piloop_common import envnames
from piloop_common.errors import BadRequest, ConfigError, NotFound
from piloop_server.state.keys import Keys
from piloop_server.state.records.secret import SecretRecord
from piloop_server.state.secrets import SecretsState

log = logging.getLogger("piloop.secrets")

KEY_FILE = "secret.key"
PENDING_FILE = "secret.key.new"  # the next key, while `rotate-key` reseals the records under it
KEY_ENV = "PILOOP_SECRET_KEY"
KEY_BYTES = 32
MAX_VALUE_BYTES = 64 * 1024


@dataclass
class SecretInfo:
    name: str
    created_ms: int
    updated_ms: int
    by: str
    key_id: str


class SecretRow(TypedDict):
    """A secret as `piloop secret list` shows it: never its value."""

    name: str
    created_ms: int
    updated_ms: int
    by: str
    key_id: str
    readable: bool  # whether this server's key opens it


@dataclass(frozen=True)
class Rotation:
    resealed: int  # records now sealed with the new key
    left: int  # records no key of this server opens, left as they were
    key_id: str  # the new key's id


def check_name(name: str, *, server: bool = False) -> str:
    """A secret's name: an environment variable's name that does not shadow a job's environment
    (`piloop_common.envnames`); `server`: the server's own secrets (`PILOOP_WORKER_CREDENTIAL`) too."""
    return envnames.check_secret_name(name, server=server)


def check_value(name: str, value: str) -> str:
    if not value:
        raise BadRequest(
            f'secret {name}: the value is empty (give it on stdin: printf %s "$V" | piloop secret set {name})'
        )
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
        raise ConfigError(
            f"{where}: the key is {len(key)} bytes; it must be {KEY_BYTES} (base64 of 32 random bytes, "
            "like `head -c 32 /dev/urandom | base64`)"
        )
    return key


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_new(path: Path, key: bytes) -> bool:
    """Write `key` to `path`, 0600, only if there is no such file; whether this call made it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        f.write(base64.b64encode(key).decode() + "\n")
        f.flush()
        os.fsync(f.fileno())
    _fsync_dir(path.parent)
    return True


class _KeyFile:
    """One key file, read again whenever it changes (another process may rotate the key)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int, int] | None = None
        self._key: bytes | None = None

    def read(self) -> bytes | None:
        """The key, or None when there is no file; ConfigError when others can read it or it holds no key."""
        try:
            st = self.path.stat()
        except FileNotFoundError:
            self._stamp = self._key = None
            return None
        if st.st_mode & 0o077:
            raise ConfigError(
                f"{self.path}: mode {stat.S_IMODE(st.st_mode):04o} lets others read the secret key; "
                f"`chmod 600 {self.path}`"
            )
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        if stamp != self._stamp:
            self._key = _decode_key(self.path.read_text(errors="replace"), str(self.path))
            self._stamp = stamp
        return self._key


class KeySource:
    """Where the key comes from. The file is checked at once (a looser mode, a wrong length or not base64 stops
    the daemon) and made on first use."""

    def __init__(self, home: Path, env: dict[str, str] | None = None) -> None:
        env = dict(os.environ if env is None else env)
        self.path = home / KEY_FILE
        self.pending_path = home / PENDING_FILE
        self.env_value = env.get(KEY_ENV) or None
        self._file = _KeyFile(self.path)
        self._pending = _KeyFile(self.pending_path)
        self._env_key: bytes | None = None
        if self.env_value is not None:
            self._env_key = _decode_key(self.env_value, f"env {KEY_ENV}")
        else:
            self._file.read()
            self._pending.read()

    def existing(self) -> bytes | None:
        """The key if there is one, without making it."""
        return self._env_key if self.env_value is not None else self._file.read()

    def pending(self) -> bytes | None:
        """The key a rotation that has not finished reseals the records with."""
        return None if self.env_value is not None else self._pending.read()

    def openers(self) -> dict[str, bytes]:
        """Every key this server may open a record with, by id: the key, and a rotation's next key."""
        return {key_id(k): k for k in (self.existing(), self.pending()) if k is not None}

    def get(self) -> bytes:
        """The key, made (0600, never overwritten) when there is none yet."""
        key = self.existing()
        if key is not None:
            return key
        new = os.urandom(KEY_BYTES)
        if not _write_new(self.path, new):  # another process made it first: use theirs
            return self.get()
        log.info("event=secret.key_created path=%s key_id=%s", self.path, key_id(new))
        return self._file.read() or new

    def begin_rotation(self) -> bytes:
        """The next key, written beside the key (`secret.key.new`); a rotation that stopped midway left one,
        which is taken again."""
        if self.env_value is not None:
            raise BadRequest(
                f"the secret key comes from env {KEY_ENV}, which piloop cannot replace: set the "
                "new key there, and `secret set` each value again"
            )
        pending = self.pending()
        if pending is not None:
            return pending
        new = os.urandom(KEY_BYTES)
        if not _write_new(self.pending_path, new):
            return self.begin_rotation()
        return self._pending.read() or new

    def finish_rotation(self) -> None:
        """The next key becomes the key (one rename, then the directory synced)."""
        os.replace(self.pending_path, self.path)
        _fsync_dir(self.path.parent)


def _open(rec: SecretRecord, key: bytes) -> str:
    """The value of `rec`, or InvalidTag/ValueError when `key` does not open it."""
    return AESGCM(key).decrypt(base64.b64decode(rec.nonce), base64.b64decode(rec.sealed), rec.name.encode()).decode()


def _seal(rec: SecretRecord, value: str, key: bytes) -> SecretRecord:
    nonce = os.urandom(12)
    sealed = AESGCM(key).encrypt(nonce, value.encode(), rec.name.encode())
    return replace(
        rec, key_id=key_id(key), nonce=base64.b64encode(nonce).decode(), sealed=base64.b64encode(sealed).decode()
    )


class Secrets:
    def __init__(self, client: Any, keys: Keys, home: Path, env: dict[str, str] | None = None) -> None:
        self.state = SecretsState(client, keys)
        self.source = KeySource(home, env)
        self._lock = threading.Lock()  # a `put` never seals with a key that a rotation is replacing

    def put(self, name: str, value: str, by: str) -> tuple[SecretInfo, bool]:
        """Seal and store `value` under `name`; the record, and whether it replaced one."""
        check_value(check_name(name, server=True), value)
        with self._lock:
            key = self.source.pending() or self.source.get()
            now = int(time.time() * 1000)
            old = self.state.get(name)
            rec = _seal(SecretRecord(name, old.created_ms if old else now, now, by, "", "", ""), value, key)
            self.state.put(rec)
        return SecretInfo(rec.name, rec.created_ms, rec.updated_ms, rec.by, rec.key_id), old is not None

    def names(self) -> set[str]:
        return self.state.names()

    def every(self) -> list[SecretRow]:
        """Each secret's name, dates, who set it, and whether this server's key opens it; never a value."""
        ids = self.source.openers()
        return [
            {
                "name": r.name,
                "created_ms": r.created_ms,
                "updated_ms": r.updated_ms,
                "by": r.by,
                "key_id": r.key_id,
                "readable": r.key_id in ids,
            }
            for r in self.state.all()
        ]

    def remove(self, name: str) -> None:
        if not self.state.remove(name):
            raise NotFound(f"no secret named {name} (see `piloop secret list`)")

    def values(self, names: list[str]) -> dict[str, str]:
        """The values of `names` for a job, opened; a name that is gone, that this key cannot open, or that would
        shadow the job's environment is left out, logged."""
        allowed = []
        for name in names:
            if envnames.problem(name):
                log.error("event=secret.refused name=%s: %s", name[:80], envnames.problem(name))
            else:
                allowed.append(name)
        return self._values(allowed)

    def server_value(self, name: str) -> str | None:
        """A secret the server uses for itself (`envnames.SERVER_SECRETS`), such as the credential of the workers
        it starts on the proxy network; None when it is not set or cannot be opened."""
        assert name in envnames.SERVER_SECRETS, name
        return self._values([name]).get(name)

    def _values(self, names: list[str]) -> dict[str, str]:
        if not names:
            return {}
        openers = self.source.openers()
        out: dict[str, str] = {}
        for name, rec in zip(names, self.state.get_many(names), strict=True):
            if rec is None:
                log.warning("event=secret.missing name=%s (removed after the job was submitted)", name)
                continue
            try:
                key = openers.get(rec.key_id)
                if key is None or rec.name != name:
                    raise InvalidTag()
                out[name] = _open(rec, key)
            except (InvalidTag, ValueError):
                log.error(
                    "event=secret.unreadable name=%s sealed_with=%s server_key=%s: set it again",
                    name,
                    rec.key_id,
                    ",".join(openers) or "none",
                )
        return out

    def rotate_key(self) -> Rotation:
        """Reseal every record under a new key. The order makes a crash at any point lose nothing:

        1. the new key is written to `secret.key.new` (0600, synced), beside the key;
        2. every record is resealed under it in one Redis transaction (all or none);
        3. `secret.key.new` is renamed over `secret.key`.

        Between 1 and 3 this server opens a record with either key (its `key_id` says which); a rotation that
        stopped there is finished by the next `rotate-key`, which takes the same new key again."""
        with self._lock:
            new = self.source.begin_rotation()
            openers = self.source.openers()

            def reseal(rec: SecretRecord) -> SecretRecord | None:
                key = openers.get(rec.key_id)
                if key is None:
                    return None
                try:
                    return _seal(rec, _open(rec, key), new)
                except (InvalidTag, ValueError):
                    return None

            resealed, left = self.state.reseal_all(reseal)
            self.source.finish_rotation()
        log.info("event=secret.key_rotated key_id=%s resealed=%d left=%d", key_id(new), resealed, left)
        return Rotation(resealed, left, key_id(new))
