"""Heartbeats gathered and handled together. A Redis round trip costs the server far more CPU than the script's
work for one worker (~0.3-0.4 ms of a ~1 ms beat on a 2-CPU VM), and so does code run cold, once every 10 ms, rather
than for several beats in a row; 1,000 workers beating every 10 s send 100 a second. The beats that arrive within a
few ms of each other are handled as one batch (`api.worker.FastBeat`: validated, their callers named, and sent to
Redis as one `heartbeat.lua` call).

A batch waits while beats keep coming: it goes when none came for QUIET times the usual gap between the beats of
one batch, or WINDOW after its first beat, or at once when beats come further apart than WINDOW (no company to wait
for). Many workers beating on their own clocks (1,000 every 10 s) share a batch each WINDOW; a few callers that
each wait for their answer before the next beat are not held for company that cannot come. A lease is renewed for
seconds; a few ms more before its answer changes nothing. Every beat of a batch hears its own answer, or the
batch's error as its own."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

WINDOW = 0.1  # seconds: the longest a beat waits for others
QUIET = 2.0  # a batch goes when no beat came for this many usual gaps
MOST = 128  # beats a batch: a batch this full goes at once
SMOOTHING = 0.2  # the weight of the newest gap in the running means


class Beats:
    """The beats of one event loop, gathered into batches for `handle`, which answers each beat of a batch, in order
    (one instance a loop: its futures belong to it)."""

    def __init__(self, handle: Callable[[list[Any]], Awaitable[list[Any]]], *, window: float = WINDOW,
                 quiet: float = QUIET, most: int = MOST) -> None:
        self.handle = handle
        self.window, self.quiet, self.most = window, quiet, most
        self._pending: list[tuple[Any, asyncio.Future]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._first = self._last = 0.0  # loop times of the gathering batch's first beat and of the last beat
        self._every = 2 * window  # running mean gap between beats (seconds): no waiting until beats come often
        self._within = window / quiet  # running mean gap between the beats of one batch
        self._sending: set[asyncio.Task] = set()  # referenced until done (the loop holds tasks weakly)
        self.calls = 0  # batches handled, for tests

    async def beat(self, beat: Any) -> Any:
        """The beat's answer from `handle`, called with whichever others come within its wait."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        gap = min(now - self._last, 2 * self.window)
        self._every += SMOOTHING * (gap - self._every)
        if self._pending:
            self._within += SMOOTHING * (gap - self._within)
        else:
            self._first = now
        self._last = now
        done = loop.create_future()
        self._pending.append((beat, done))
        # the usual gap within a batch, but never much under the gap between any beats: batches that went alone
        # (their wait too short for the next beat) would leave the former nothing to learn from
        due = min(self._first + self.window, now + self.quiet * max(self._within, 0.75 * self._every))
        if len(self._pending) >= self.most or self._every >= self.window or due <= now:
            self._flush()
        else:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = loop.call_at(due, self._flush)
        return await done

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch, self._pending = self._pending, []
        if batch:
            task = asyncio.get_running_loop().create_task(self._send(batch))
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    async def _send(self, batch: list[tuple[Any, asyncio.Future]]) -> None:
        self.calls += 1
        try:
            answers = await self.handle([b for b, _ in batch])
        except Exception as e:  # the batch failed as a whole: each caller raises it as its own
            for _, done in batch:
                if not done.done():  # its caller may have gone (its task cancelled)
                    done.set_exception(e)
            return
        for (_, done), answer in zip(batch, answers):
            if not done.done():
                done.set_result(answer)
