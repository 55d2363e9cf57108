"""`HeldLease`: one lease this worker holds, the (job, fencing token) pair every part names it by.

Its report id and its name are derived here, once; a log line names it `job=%s token=%s`, `*lease`. Kept light
(a NamedTuple, no pydantic).
"""

from __future__ import annotations

from typing import NamedTuple

REPORT_NS = "5d1b7c3e-8f0a-4e4b-9c55-7a1f0c2d9e61"


def report_id_for(job: str, token: str) -> str:
    """One report id per lease, so a report rebuilt after a crash is the same report to the server."""
    import uuid

    return str(uuid.uuid5(uuid.UUID(REPORT_NS), f"{job}/{token}"))


class HeldLease(NamedTuple):
    """A job and the fencing token of the lease this worker holds it under. Its fence deadline is not here: it moves
    at every acknowledged renewal and is the job's supervisor's to enforce (`fencing.py`), not part of the lease."""

    job: str
    token: str

    @property
    def name(self) -> str:
        """The lease's name on this worker: the job and the token's fencing part
        (`<generation><counter>`, unique per lease), without its random part, which would push the relay's socket
        path past AF_UNIX's 108 bytes sooner."""
        return f"{self.job}.{self.token.partition('.')[0]}"

    @property
    def report_id(self) -> str:
        return report_id_for(self.job, self.token)
