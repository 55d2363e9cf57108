"""What crosses a slot's control socket, one JSON datagram a message, typed once (docs/worker.md, "Slots").

    worker → supervisor: Hello, Start, Stop, Ack, Bye
    supervisor → worker: State (the answer to Hello), Started, Ended

    sock.send(encode(Start(generation=7, job=..., token=..., deadline=..., request=SlotRequest(argv=["true"]))))
    msg = parse(sock.recv(MAX_DATAGRAM))       # WireError (a ValueError) naming what is wrong

Bytes (a task's inline arguments and value) travel as base64. Fields a message has and this release does not know
are ignored, so either side may be newer by a field.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any, NamedTuple

from piloop_worker.records import CgroupGrant, ExitRecord, StopReason

MAX_DATAGRAM = 1 << 20  # a request with 64 KiB of arguments is ~90 KiB as base64; the socket buffers are set above


class WireError(ValueError):
    """A datagram that is not a slot message; the message says which part is wrong."""


class SlotRequest(NamedTuple):
    """What a job needs to start: a process job's `argv`, or a task's `task` (`module:function`) with its inline
    arguments. `env` is what the job adds to the supervisor's environment (its secrets among them: they cross the
    socket, never a file). `cwd` None is the slot's `work/`."""

    argv: list[str]
    env: dict[str, str] = {}  # noqa: RUF012 — a field's default, never mutated
    cwd: str | None = None
    kill_grace: float = 5.0
    timeout: float | None = None
    cgroup: CgroupGrant | None = None
    task: str | None = None
    code: str | None = None  # a task's shipped code dir, unpacked
    user: dict[str, Any] | None = None  # jobuser.JobUser.wire(): the user the job runs as
    worker: str = ""  # the worker's name, for an unimportable module's reason
    warm_max_tasks: int = 0  # 0: a fresh fork per task
    warm_max_rss_mb: int = 0
    metrics_seconds: float = 5.0
    serializer: str = "json"  # of `args`, `parent` and the value: "json" or "pickle"
    args: bytes | None = None  # {"args": [...], "kwargs": {...}} in `serializer`
    parent: bytes | None = None  # a chain link's parent's value, as its task returned it
    # arguments or a parent's value over the inline cap: files the worker fetched them to, read by the task's process
    args_file: str | None = None
    parent_file: str | None = None
    parent_serializer: str = ""  # the parent's value's, where it is not `serializer` ("": the same)

    def to_json(self) -> dict[str, Any]:
        d = self._asdict()
        d["cgroup"] = self.cgroup._asdict() if self.cgroup is not None else None
        d["args"], d["parent"] = _b64(self.args), _b64(self.parent)
        return d

    @classmethod
    def from_json(cls, d: Any) -> SlotRequest:
        d = _object(d, "request")
        if not isinstance(d.get("argv"), list):
            raise WireError("request: argv must be a list")
        cg = d.get("cgroup")
        return cls(
            **{
                **_known(cls._fields, d),
                "cgroup": CgroupGrant(**_known(CgroupGrant._fields, _object(cg, "cgroup"))) if cg else None,
                "args": _unb64(d.get("args"), "args"),
                "parent": _unb64(d.get("parent"), "parent"),
            }
        )


class Hello(NamedTuple):
    """A worker that connected: the supervisor answers with its `State`."""

    def to_json(self) -> dict[str, Any]:
        return {}

    @classmethod
    def from_json(cls, d: Any) -> Hello:
        return cls()


class Start(NamedTuple):
    generation: int
    job: str
    token: str
    deadline: float  # clock.now() seconds; the record's deadline for this generation replaces it once written
    request: SlotRequest
    # the worker's record of the assignment (no secret values), opaque here: given back in `Holding` and `Ended`, so
    # a restarted worker adopts the job, or reports its end, without a file of its own
    record: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {**self._asdict(), "request": self.request.to_json()}

    @classmethod
    def from_json(cls, d: Any) -> Start:
        rec = d.get("record")
        return cls(
            generation=int(d["generation"]),
            job=str(d["job"]),
            token=str(d["token"]),
            deadline=float(d["deadline"]),
            request=SlotRequest.from_json(d["request"]),
            record=_object(rec, "record") if rec is not None else None,
        )


class Stop(NamedTuple):
    generation: int
    reason: StopReason

    def to_json(self) -> dict[str, Any]:
        return {"generation": self.generation, "reason": str(self.reason)}

    @classmethod
    def from_json(cls, d: Any) -> Stop:
        return cls(int(d["generation"]), StopReason.read(str(d.get("reason") or "")))


class Ack(NamedTuple):
    """The worker has the job's end (its report spooled or answered): the supervisor forgets it."""

    generation: int

    def to_json(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_json(cls, d: Any) -> Ack:
        return cls(int(d["generation"]))


class Bye(NamedTuple):
    """The worker is leaving for good: the supervisor exits once it holds no job."""

    def to_json(self) -> dict[str, Any]:
        return {}

    @classmethod
    def from_json(cls, d: Any) -> Bye:
        return cls()


class Started(NamedTuple):
    generation: int
    pid: int  # the job's leader (its process group), or the task's process
    started: float  # wall clock

    def to_json(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_json(cls, d: Any) -> Started:
        return cls(int(d["generation"]), int(d["pid"]), float(d["started"]))


class Ended(NamedTuple):
    """How job `generation` ended. A task's value is `result` when it fits inline (`INLINE_MAX_BYTES`), else it is
    in `result_file` (under the slot's `work/`, until the slot's next start)."""

    generation: int
    exit: ExitRecord
    result: bytes | None = None
    result_file: str | None = None
    job: str = ""  # the start's job, token and record, for a worker that did not send it (a restarted one)
    token: str = ""
    record: dict[str, Any] | None = None
    error: bytes | None = None  # a failed task's record (JSON), its report's `error.json`

    def to_json(self) -> dict[str, Any]:
        return {
            "generation": self.generation,
            "exit": {**self.exit._asdict(), "usage": self.exit.usage._asdict()},  # `ExitRecord.wire()`'s, unencoded
            "result": _b64(self.result),
            "result_file": self.result_file,
            "job": self.job,
            "token": self.token,
            "record": self.record,
            "error": _b64(self.error),
        }

    @classmethod
    def from_json(cls, d: Any) -> Ended:
        rf, rec = d.get("result_file"), d.get("record")
        return cls(
            int(d["generation"]),
            ExitRecord.parse(json.dumps(_object(d.get("exit"), "exit"))),
            _unb64(d.get("result"), "result"),
            str(rf) if rf else None,
            str(d.get("job") or ""),
            str(d.get("token") or ""),
            _object(rec, "record") if rec is not None else None,
            _unb64(d.get("error"), "error"),
        )

    def of(self, start: Start) -> Ended:
        """This end, naming `start`'s job, token and record."""
        return self._replace(job=start.job, token=start.token, record=start.record)


class Holding(NamedTuple):
    generation: int
    job: str
    token: str
    pid: int
    started: float  # wall clock: with `pid`, tells the job's group from a later one with the same id
    cgroup: str | None = None  # the job's cgroup, for a worker that must kill what is left of it
    record: dict[str, Any] | None = None  # the start's (`Start.record`)

    def to_json(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_json(cls, d: Any) -> Holding:
        d = _object(d, "holding")
        cg, rec = d.get("cgroup"), d.get("record")
        return cls(
            int(d["generation"]),
            str(d["job"]),
            str(d["token"]),
            int(d["pid"]),
            float(d["started"]),
            cg and str(cg),
            _object(rec, "record") if rec is not None else None,
        )


class State(NamedTuple):
    """What the supervisor holds: the running job, and the ended ones not yet acknowledged."""

    holding: Holding | None
    ended: list[Ended]

    def to_json(self) -> dict[str, Any]:
        return {
            "holding": self.holding.to_json() if self.holding is not None else None,
            "ended": [e.to_json() for e in self.ended],
        }

    @classmethod
    def from_json(cls, d: Any) -> State:
        h, ended = d.get("holding"), d.get("ended") or []
        if not isinstance(ended, list):
            raise WireError("state: ended must be a list")
        return cls(Holding.from_json(h) if h else None, [Ended.from_json(_object(e, "ended")) for e in ended])


Message = Hello | Start | Stop | Ack | Bye | State | Started | Ended
TAGS: dict[str, type[Message]] = {
    "hello": Hello,
    "start": Start,
    "stop": Stop,
    "ack": Ack,
    "bye": Bye,
    "state": State,
    "started": Started,
    "ended": Ended,
}
_TAG_OF = {cls: tag for tag, cls in TAGS.items()}


def encode(msg: Message) -> bytes:
    return json.dumps({"t": _TAG_OF[type(msg)], **msg.to_json()}, separators=(",", ":")).encode()


def parse(raw: bytes) -> Message:
    """One datagram as a message; WireError naming what is wrong."""
    try:
        d = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise WireError(f"not JSON: {e}") from None
    d = _object(d, "message")
    tag = d.get("t")
    cls = TAGS.get(tag) if isinstance(tag, str) else None
    if cls is None:
        raise WireError(f"unknown message type {tag!r}; known: {', '.join(TAGS)}")
    try:
        return cls.from_json(d)
    except WireError as e:
        raise WireError(f"{tag}: {e}") from None
    except KeyError as e:
        raise WireError(f"{tag}: missing field {e}") from None
    except (TypeError, ValueError) as e:
        raise WireError(f"{tag}: {e}") from None


def _object(d: Any, what: str) -> dict[str, Any]:
    if not isinstance(d, dict):
        raise WireError(f"{what} must be a JSON object")
    return d


def _known(fields: tuple[str, ...], d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if k in fields}


def _b64(data: bytes | None) -> str | None:
    return base64.b64encode(data).decode() if data is not None else None


def _unb64(raw: Any, what: str) -> bytes | None:
    if raw is None:
        return None
    if not isinstance(raw, str):
        raise WireError(f"{what} must be base64 text")
    try:
        return base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        raise WireError(f"{what} is not base64") from None


__all__ = [
    "MAX_DATAGRAM",
    "TAGS",
    "Ack",
    "Bye",
    "Ended",
    "Hello",
    "Holding",
    "Message",
    "SlotRequest",
    "Start",
    "Started",
    "State",
    "Stop",
    "WireError",
    "encode",
    "parse",
]
