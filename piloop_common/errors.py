"""One error hierarchy for piloop: every error has a stable code and an HTTP status.

Routes never build HTTP errors from domain code: one handler maps `PiloopError` to a
response (`{"error": code, "message": ...}`), and the client maps it back with `from_payload`.
"""

from __future__ import annotations


class PiloopError(Exception):
    code = "error"
    status = 500

    def __init__(self, message: str, **details: object) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def to_payload(self) -> dict[str, object]:
        return {"error": self.code, "message": self.message, **self.details}


class ConfigError(PiloopError):
    """A config file, env variable, flag or limit is wrong; the message names which."""

    code = "config"
    status = 400


class BadRequest(PiloopError):
    code = "bad_request"
    status = 400


def bad_param(param: str, value: object, why: str, flag: str = "") -> BadRequest:
    """A request's parameter refused, named as the Python API names it (`pool='gpu': no such pool`); the CLI shows
    the flag of the command it ran instead (`--pool gpu: no such pool`; `flag` when it is not `--<param>`)."""
    return BadRequest(
        f"{param}={value!r}: {why}", param=param, value=value, flag=flag or "--" + param.replace("_", "-")
    )


def as_flag(e: PiloopError, args: list[str]) -> str:
    """`e`'s message naming the CLI flag (`--pool gpu: …`) when the command line `args` gave that flag, else as is."""
    param, value, flag = e.details.get("param"), e.details.get("value"), e.details.get("flag")
    if not isinstance(param, str) or not isinstance(flag, str):
        return e.message
    if not any(a == flag or a.startswith(flag + "=") for a in args):
        return e.message
    shown = ", ".join(map(str, value)) if isinstance(value, list) else value
    return e.message.replace(f"{param}={value!r}", f"{flag} {shown}", 1)


class TooLarge(BadRequest):
    """A write over one of the caps on what a caller may make the server keep; the message names the cap's key."""

    code = "too_large"
    status = 413


class NotFound(PiloopError):
    code = "not_found"
    status = 404


class Unauthorized(PiloopError):
    code = "unauthorized"
    status = 401


class Forbidden(PiloopError):
    code = "forbidden"
    status = 403


class Conflict(PiloopError):
    code = "conflict"
    status = 409


class LeaseLost(Conflict):
    """A write named a token that no longer holds the job's lease: nothing changed."""

    code = "lease_lost"


class DirInUse(Conflict):
    """Another live worker holds this worker's directory (one worker per directory): the worker exits with code 4."""

    code = "dir_in_use"


class Refused(PiloopError):
    """The server refuses this worker (protocol, pool, token, CAS): the worker exits with code 3."""

    code = "refused"
    status = 403


class StoreError(PiloopError):
    """The CAS failed: a missing blob, a hash mismatch, an unreachable remote."""

    code = "store"
    status = 502


class BlobMissing(StoreError):
    code = "blob_missing"
    status = 404


class Corrupt(StoreError):
    code = "corrupt"
    status = 502


class BadAddress(StoreError):
    code = "bad_address"
    status = 400


class Unavailable(PiloopError):
    """A service (the server, Redis, a remote store) cannot be reached; retrying may help."""

    code = "unavailable"
    status = 503


class TaskFailed(PiloopError):
    """A task (`piloop_common.tasks`) ended without a value: its error and traceback, or the job's state."""

    code = "task_failed"
    status = 500


class TaskRevoked(TaskFailed):
    """A task that never ran to its end because it was withdrawn: cancelled, or expired before it started."""

    code = "task_revoked"


class WaitTimeout(PiloopError, TimeoutError):
    """A job did not end within the time a caller waits for it."""

    code = "timeout"
    status = 504


_BY_CODE: dict[str, type[PiloopError]] = {}


def _register(cls: type[PiloopError]) -> None:
    _BY_CODE.setdefault(cls.code, cls)
    for sub in cls.__subclasses__():
        _register(sub)


_register(PiloopError)


def from_payload(payload: dict[str, object], status: int) -> PiloopError:
    """The error a server answer stands for (the client's half of the mapping)."""
    code = str(payload.get("error", "error"))
    message = str(payload.get("message", f"the server answered {status}"))
    details = {k: v for k, v in payload.items() if k not in ("error", "message")}
    cls = _BY_CODE.get(code, PiloopError)
    err = cls(message, **details)
    if cls is PiloopError:
        err.code = code
        err.status = status
    return err
