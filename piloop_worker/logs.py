"""A job's output (its slot's `output.log`) to the CAS in chunks, a few seconds after it is written (so at least
every 30 s).

The slot's `log.json` keeps how far the log is in the CAS and which chunks the server has, so a restarted worker
neither resends nor skips bytes; it is written only when a chunk is shipped, and a job's start begins it again (the
supervisor empties `output.log` then). Past [plugins.state] log_max_bytes nothing more is shipped but one marker
chunk (`protocol.log_marker`): the server would keep no more, and the CAS holds none of it.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from piloop_common.bytecaps import LOG_MAX_BYTES, log_marker
from piloop_common.cas import Store
from piloop_worker import clock
from piloop_worker.records import atomic_write

CHUNK_MAX = 4 * 1024 * 1024
SHIP_AFTER_SECONDS = 3.0  # new bytes go this long after they first appear (well within the promised 30 s)


class LogShipper:
    """`output_log` shipped; `state` its `log.json`, read back when `resume` (a job adopted from an earlier worker),
    else removed (a new job's log starts empty)."""

    def __init__(self, output_log: Path, state: Path, resume: bool = False) -> None:
        self.output_log, self.state = output_log, state
        st: dict[str, Any] = {}
        if resume:
            with contextlib.suppress(OSError, ValueError):
                st = json.loads(state.read_bytes())
        else:
            with contextlib.suppress(FileNotFoundError):
                state.unlink()
        self.offset: int = int(st.get("offset", 0))
        self.chunks: list[str] = list(st.get("chunks", []))
        self.posted: int = int(st.get("posted", 0))
        self.truncated: bool = bool(st.get("truncated", False))
        self._seen_size = self.offset
        self._pending_since: float | None = None

    def _save(self) -> None:
        # not fsynced: after a crash of the machine a lost state means chunks put again (the CAS dedups them)
        data = {"offset": self.offset, "chunks": self.chunks, "posted": self.posted, "truncated": self.truncated}
        atomic_write(self.state, json.dumps(data, sort_keys=True), durable=False)

    def due(self, now: float | None = None) -> bool:
        """Whether new bytes wait and the job has been quiet a little, or they have waited long enough."""
        if self.truncated:
            return self.posted < len(self.chunks)
        now = clock.now() if now is None else now
        try:
            size = self.output_log.stat().st_size
        except OSError:
            size = self.offset
        if size != self._seen_size:
            self._seen_size = size
            if self._pending_since is None:
                self._pending_since = now
        if size <= self.offset:
            return self.posted < len(self.chunks)
        return self._pending_since is not None and now - self._pending_since >= SHIP_AFTER_SECONDS

    def upload(self, store: Store, max_bytes: int = LOG_MAX_BYTES) -> list[str]:
        """Put the log's new bytes in the CAS, its first `max_bytes` and then a marker if it has more; the chunks the
        server has not been told of yet."""
        try:
            with open(self.output_log, "rb") as f:
                f.seek(self.offset)
                while not self.truncated:
                    room = max_bytes - self.offset
                    data = f.read(min(CHUNK_MAX, room)) if room > 0 else b""
                    if data:
                        self.chunks.append(store.put_bytes(data))
                        self.offset += len(data)
                    elif room <= 0 and f.read(1):
                        self.chunks.append(store.put_bytes(log_marker(max_bytes)))
                        self.truncated = True
                    else:
                        break
                    self._save()
        except FileNotFoundError:
            pass
        self._pending_since = None
        return self.chunks[self.posted :]

    def mark_posted(self, n: int) -> None:
        self.posted += n
        self._save()
