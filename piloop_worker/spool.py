"""Reports waiting to be answered: `$PILOOP_HOME/spool/<worker>/<report_id>.json`.

A report is written here before it is sent and removed only once the server answered it (accepted
or stale), so a worker that stops or dies first sends it when it starts again. Resending the same
JSON is safe: the server gives a report id's second copy the first one's answer.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from piloop_common.protocol import ReportRequest
from piloop_worker.jobdir import atomic_write


class Spool:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)

    def path(self, report_id: str) -> Path:
        return self.root / f"{report_id}.json"

    def write(self, report: ReportRequest) -> Path:
        p = self.path(report.report_id)
        atomic_write(p, report.model_dump_json())
        return p

    def pending(self) -> list[ReportRequest]:
        """Every spooled report, oldest first (a corrupt file is set aside, never sent, never lost)."""
        out = []
        files = sorted(self.root.glob("*.json"), key=lambda p: p.stat().st_mtime)
        for p in files:
            try:
                out.append(ReportRequest.model_validate_json(p.read_text()))
            except (OSError, ValueError):
                with contextlib.suppress(OSError):
                    p.rename(p.with_suffix(".bad"))
        return out

    def has(self, report_id: str) -> bool:
        return self.path(report_id).exists()

    def remove(self, report_id: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path(report_id).unlink()
