"""A job's record of its assignment: made when the job starts and sent with it to its slot's supervisor
(`slots.wire.Start.record`), which gives it back to a worker that restarted (`Holding.record`, `Ended.record`), so
that worker adopts the job, or reports its end, without a file of its own."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from piloop_common.protocol.worker import Assignment, JobSpec, Kind


class BadJobRecord(ValueError):
    """A `job.json` that is not a job's record (not JSON, a part of one, a field missing or of the wrong type)."""


class JobRecord(BaseModel):
    """The assignment less its secrets' values, with what the worker adds when it starts the job."""

    model_config = ConfigDict(extra="ignore")  # a field another version of the worker wrote does not bury the job

    job: str
    token: str
    kind: Kind
    pool: str
    campaign: str = ""
    image: str = ""
    spec: JobSpec
    memory_mb: int | None = None  # the attempt's grant (MiB); none: limited to the worker's room
    secret_names: list[str] = Field(default_factory=list)  # the secrets it was given (never their values)
    claimed_at: float = 0.0  # epoch seconds
    relay: str = ""  # the job's relay socket
    fetched_bytes: int = 0  # a campaign job's bundle bytes fetched to check its commit out

    @classmethod
    def from_assignment(cls, a: Assignment, relay: Path, claimed_at: float) -> JobRecord:
        # built from the assignment's validated fields (its spec shared, never changed): a dump and a validation
        # again cost a warm task's start more than the rest of its record
        return cls.model_construct(
            job=a.job,
            token=a.token,
            kind=a.kind,
            pool=a.pool,
            campaign=a.campaign,
            image=a.image,
            spec=a.spec,
            memory_mb=a.memory_mb,
            secret_names=sorted(a.secrets),
            claimed_at=claimed_at,
            relay=str(relay),
            fetched_bytes=0,
        )

    @classmethod
    def from_dict(cls, data: Any, where: str = "job.json") -> JobRecord:
        """The record `data` holds; BadJobRecord naming `where` and each field that is wrong."""
        if not isinstance(data, dict):
            raise BadJobRecord(f"{where}: not a job record (a JSON object), but {type(data).__name__}")
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            wrong = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
            raise BadJobRecord(f"{where}: not a job record ({wrong})") from e

    @classmethod
    def from_json(cls, text: str, where: str = "job.json") -> JobRecord:
        try:
            data = json.loads(text)
        except ValueError as e:
            raise BadJobRecord(f"{where}: not JSON, or cut short ({e})") from e
        return cls.from_dict(data, where)

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def to_start(self) -> dict[str, Any]:
        """As a supervisor keeps it: the inline inputs' names without their bytes, which the start carries once
        already."""
        d = self.to_dict()
        d["spec"]["inline_inputs"] = dict.fromkeys(d["spec"]["inline_inputs"], "")
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)
