"""Reports waiting to be answered: `$PILOOP_HOME/spool/<worker>/<report_id>.json`.

A report is written here before it is sent and removed only once the server answered it (accepted
or stale), so a worker that stops or dies first sends it when it starts again. Resending the same
JSON is safe: the server gives a report id's second copy the first one's answer.

A report is fsynced only when its job ran `DURABLE_AFTER_SECONDS` or longer. What the fsync buys is the report
through a crash of the machine (a dead worker process loses nothing: the page cache keeps the file), and without it
the job's lease expires and the job runs again, as does a short job that ended just before the crash (its exit record
is not fsynced either, `JobDir.write_exit`). Running a short job again costs less than an fsync on every short job: it was a tenth of a
no-op task's machine CPU and left the CPUs idle waiting on the disk (docs/performance.md).

A report the server refuses as malformed, or a file that is not a report, is set aside as `<report_id>.bad` for
a person to read, never sent again; the newest `BAD_KEPT` are kept, so a worker that keeps making bad reports
cannot fill its disk with them.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

from piloop_common.protocol.report import ReportRequest
from piloop_worker.records import DURABLE_AFTER_SECONDS, atomic_write

log = logging.getLogger("piloop.worker")

BAD_KEPT = 100


class Spool:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)

    def path(self, report_id: str) -> Path:
        return self.root / f"{report_id}.json"

    def write(self, report: ReportRequest) -> Path:
        p = self.path(report.report_id)
        atomic_write(p, report.model_dump_json(), durable=report.duration_seconds >= DURABLE_AFTER_SECONDS)
        return p

    def pending(self) -> list[ReportRequest]:
        """Every spooled report, oldest first (a corrupt file is set aside, never sent, never lost)."""
        out = []
        files = sorted(self.root.glob("*.json"), key=_mtime)
        for p in files:
            try:
                out.append(ReportRequest.model_validate_json(p.read_text()))
            except (OSError, ValueError):
                self._set_aside(p)
        return out

    def set_aside(self, report_id: str) -> None:
        """The report the server refused as malformed, out of the way of the sends: `<report_id>.bad`."""
        self._set_aside(self.path(report_id))

    def _set_aside(self, p: Path) -> None:
        with contextlib.suppress(OSError):
            p.rename(p.with_suffix(".bad"))
        bad = sorted(self.root.glob("*.bad"), key=_mtime)
        for old in bad[: max(0, len(bad) - BAD_KEPT)]:
            with contextlib.suppress(OSError):
                old.unlink()
                log.warning("event=spool.bad_removed path=%s (more than %d set aside)", old, BAD_KEPT)

    def has(self, report_id: str) -> bool:
        return self.path(report_id).exists()

    def remove(self, report_id: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path(report_id).unlink()


def _mtime(p: Path) -> float:
    try:
        return p.stat().st_mtime
    except OSError:
        return 0.0  # gone meanwhile: first in line to be removed, which it already is
