"""Periodic schedules on the API (`/v1/schedules`): what `piloop schedule add` sends and `schedule list` shows."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from piloop_common.errors import BadRequest
from piloop_common.protocol.operator import SubmitRequest
from piloop_common.protocol.worker import Message

SCHEDULE_NAME = r"^[a-z0-9][a-z0-9_-]{0,39}$"


def check_cron(cron: str) -> str:
    """`cron` when croniter reads it, else BadRequest saying what a cron is (the CLI checks it too, before a call)."""
    from datetime import UTC, datetime

    from croniter import CroniterBadCronError, CroniterBadDateError, croniter

    if len(cron.split()) not in (5, 6):
        raise BadRequest(
            f"--cron {cron!r}: not a cron ({len(cron.split())} fields); give five, minute hour day month weekday (UTC), like "
            "'*/5 * * * *', or six with seconds last"
        )
    try:
        croniter(cron, datetime.now(UTC)).get_next(float)  # a cron with no next date (Feb 30) is none either
    except (CroniterBadCronError, CroniterBadDateError, ValueError, KeyError, OverflowError) as e:
        raise BadRequest(
            f"--cron {cron!r}: not a cron ({e}); give five fields, minute hour day month weekday (UTC), like "
            "'*/5 * * * *', or six with seconds last"
        ) from None
    return cron


class ScheduleRequest(Message):
    name: str = Field(pattern=SCHEDULE_NAME, description="Lowercase letters, digits, _ and -, at most 40.")
    cron: str = Field(
        min_length=1,
        max_length=200,
        description="Five fields (minute hour day month weekday, UTC), or six with seconds last (croniter's).",
    )
    job: SubmitRequest = Field(description="The job each tick queues, as `POST /v1/jobs` takes it (no `after`).")


class ScheduleView(Message):
    name: str
    cron: str
    next_ms: int | None = Field(description="Its next tick (ms since the epoch, Redis's clock).")
    kind: str
    pool: str
    campaign: str = ""
    image: str = ""
    spec: dict[str, Any]
    by: str
    created_ms: int
