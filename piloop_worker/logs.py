"""A job's `output.log` to the CAS in chunks, a few seconds after it is written (so at least every 30 s).

`log.json` in the job's dir keeps how far the log is in the CAS and which chunks the server has, so a
restarted worker neither resends nor skips bytes. Past [plugins.state] log_max_bytes nothing more is shipped but
one marker chunk (`protocol.log_marker`): the server would keep no more, and the CAS holds none of it.
"""

from __future__ import annotations

from typing import Any

from piloop_common.bytecaps import LOG_MAX_BYTES, log_marker
from piloop_common.cas import Store
from piloop_worker import clock
from piloop_worker.jobdir import JobDir, atomic_json, read_json

CHUNK_MAX = 4 * 1024 * 1024
SHIP_AFTER_SECONDS = 3.0  # new bytes go this long after they first appear (well within the promised 30 s)


class LogShipper:
    def __init__(self, jd: JobDir) -> None:
        self.jd = jd
        st: dict[str, Any] = read_json(jd.log_state) or {}
        self.offset: int = int(st.get("offset", 0))
        self.chunks: list[str] = list(st.get("chunks", []))
        self.posted: int = int(st.get("posted", 0))
        self.truncated: bool = bool(st.get("truncated", False))
        self._seen_size = self.offset
        self._pending_since: float | None = None

    def _save(self) -> None:
        # not fsynced: after a crash of the machine a lost state means chunks put again (the CAS dedups them)
        atomic_json(
            self.jd.log_state,
            {"offset": self.offset, "chunks": self.chunks, "posted": self.posted, "truncated": self.truncated},
            durable=False,
        )

    def due(self, now: float | None = None) -> bool:
        """Whether new bytes wait and the job has been quiet a little, or they have waited long enough."""
        if self.truncated:
            return self.posted < len(self.chunks)
        now = clock.now() if now is None else now
        try:
            size = self.jd.output_log.stat().st_size
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
            with open(self.jd.output_log, "rb") as f:
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
