"""The files of one slot, `<dir>/slots/<n>/`, made once when the slot is first used and never per job
(docs/worker.md, "Slots")."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

# a large task value is left here for the worker, named in `ended` (`wire.Ended.result_file`); the next start
# empties `work/`, so the worker takes it into the CAS before it starts the slot's next job
RESULT_FILE = ".piloop-result"


class SlotDir:
    """Paths of a slot's files; `make()` creates the dir and `work/` (idempotent)."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)
        self.lock = self.root / "lock"  # flock'd by the supervisor for its whole life
        self.record = self.root / "slot"  # the mapped deadline record (`record.py`)
        self.sock = self.root / "sock"  # the supervisor's control socket
        self.output_log = self.root / "output.log"  # the running job's stdout and stderr
        self.metrics = self.root / "metrics.jsonl"  # host samples of the running job, past its first second
        self.work = self.root / "work"  # the default cwd of a process job and of tasks
        self.supervisor_log = self.root / "supervisor.log"
        self.ended = self.root / "ended.json"  # ended jobs no worker acknowledged, while none is connected

    @classmethod
    def of(cls, workdir: Path | str, n: int) -> SlotDir:
        return cls(Path(workdir) / "slots" / str(n))

    def make(self) -> None:
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.work.mkdir(mode=0o755, exist_ok=True)

    def result_file(self, serializer: str) -> Path:
        return self.work / f"{RESULT_FILE}.{serializer}"

    def empty_work(self) -> bool:
        """Remove what the last job left in `work/` (one scandir when it left nothing); whether anything was."""
        with os.scandir(self.work) as it:
            left = [e.path for e in it]
        for path in left:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
        return bool(left)

    def __repr__(self) -> str:
        return f"SlotDir({str(self.root)!r})"


__all__ = ["RESULT_FILE", "SlotDir"]
