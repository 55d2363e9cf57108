"""Signatures, groups, chains and periodic tasks, in Celery's words where they fit.

    from piloop_common.tasks import chain, group, periodic

    add.s(2, 3)                                  # a signature: a task and its arguments, not queued yet
    chain(add.s(2, 3), double.s()).delay()       # double(add(2, 3)): double waits for add, gets its result first
    group(add.s(i, i) for i in range(10)).delay().get(timeout=60)   # [0, 2, 4, …], in order
    add.map([1, 2, 3])                           # a GroupResult: one job per item

    @periodic(cron="*/5 * * * *")                # a task with a cron; `client.schedule(report)` registers it
    def report(): ...

A chain's link is a job waiting on the one before (its spec's `after` and `pipe`): the server queues it once its
parent has succeeded, filling in the parent's result as its input `parent.<serializer>`, which the worker passes as
its first argument; a parent that fails ends every link after it `cancelled`, naming the parent.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from typing import Any

from piloop_common.errors import Conflict, WaitTimeout
from piloop_common.sdk.taskresult import AsyncResult
from piloop_common.sdk.tasks import Client, Task, task


class Signature:
    """A task with its arguments (and options), not queued yet: `task.s(*args, **kwargs)`."""

    def __init__(self, t: Task[Any], args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> None:
        self.task, self.args, self.kwargs = t, tuple(args), dict(kwargs or {})

    def __repr__(self) -> str:
        shown = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs.items()]
        return f"{self.task.name}({', '.join(shown)})"

    def __or__(self, other: Signature | Chain) -> Chain:
        return Chain(self, *(other.links if isinstance(other, Chain) else (other,)))

    def delay(self) -> AsyncResult[Any]:
        return self.apply_async()

    def apply_async(
        self, *, client: Client | None = None, depends_on: list[str] | None = None, pipe: AsyncResult[Any] | None = None
    ) -> AsyncResult[Any]:
        """Queue it; with `pipe`, that task's result is prepended to its arguments once it has succeeded."""
        return self.task.apply_async(
            self.args,
            self.kwargs,
            client=client,
            depends_on=depends_on,
            pipe=(pipe.id, pipe.serializer) if pipe is not None else None,
        )


class Chain:
    """Tasks run one after another, each given the one before's result as its first argument."""

    def __init__(self, *links: Signature) -> None:
        if not links:
            raise ValueError("chain(): give at least one signature (task.s(…))")
        self.links = links

    def __or__(self, other: Signature | Chain) -> Chain:
        return Chain(*self.links, *(other.links if isinstance(other, Chain) else (other,)))

    def delay(self) -> AsyncResult[Any]:
        return self.apply_async()

    def apply_async(self, *, client: Client | None = None) -> AsyncResult[Any]:
        """Queue every link at once (each after waits on the one before); the last link's result, whose `.parents`
        are the links before it, first first."""
        done: list[AsyncResult[Any]] = []
        for link in self.links:
            c = client or (done[0].client if done else None)
            done.append(link.apply_async(client=c, pipe=done[-1] if done else None))
        last = done[-1]
        last.parents = done[:-1]
        return last


def chain(*links: Signature) -> Chain:
    return Chain(*links)


class GroupResult:
    """The results of a group's jobs, in the group's order."""

    def __init__(self, results: list[AsyncResult[Any]]) -> None:
        self.results = results

    def __repr__(self) -> str:
        return f"<GroupResult of {len(self.results)}>"

    def __len__(self) -> int:
        return len(self.results)

    def __iter__(self) -> Any:
        return iter(self.results)

    @property
    def ids(self) -> list[str]:
        return [r.id for r in self.results]

    def _states(self) -> list[str]:
        return [r.state for r in self.results]

    def ready(self) -> bool:
        """Every job has ended."""
        return all(r.ready() for r in self.results)

    def successful(self) -> bool:
        """Every job has succeeded."""
        return all(st == "succeeded" for st in self._states())

    def completed_count(self) -> int:
        """How many have succeeded."""
        return self._states().count("succeeded")

    def get(self, timeout: float | None = None) -> list[Any]:
        """Each job's value, in order, once all have ended; `TaskFailed` for the first that failed (in order),
        `WaitTimeout` when `timeout` (seconds, for the whole group) passes first."""
        import time

        end = None if timeout is None else time.monotonic() + timeout
        out = []
        for r in self.results:
            left = None if end is None else max(0.0, end - time.monotonic())
            try:
                out.append(r.get(timeout=left))
            except WaitTimeout as e:
                raise WaitTimeout(f"group: {e.message}", job=r.id) from None
        return out

    def cancel(self) -> dict[str, str]:
        """Cancel every job not ended yet; each job's state after (`cancelled`, `cancelling`, or its end)."""
        from piloop_common.sdk.client import part

        out = {}
        for r in self.results:
            try:
                out[r.id] = str(r.client.api.call("POST", f"/v1/jobs/{part(r.id)}/cancel")["state"])
            except Conflict:  # it had ended
                out[r.id] = r.state
        return out


class Group:
    """Tasks run side by side: `group(sigs).delay()` queues them all; its `GroupResult`."""

    def __init__(self, sigs: Iterable[Signature]) -> None:
        self.sigs = list(sigs)

    def delay(self) -> GroupResult:
        return self.apply_async()

    def apply_async(self, *, client: Client | None = None) -> GroupResult:
        results: list[AsyncResult[Any]] = []
        try:
            for sig in self.sigs:
                results.append(sig.apply_async(client=client))
        except BaseException:  # a group is queued whole or not at all: the ones queued already are withdrawn
            with contextlib.suppress(Exception):
                GroupResult(results).cancel()
            raise
        return GroupResult(results)


def group(*sigs: Signature | Iterable[Signature]) -> Group:
    """`group(a.s(1), b.s(2))` or `group(sig for …)`."""
    flat: list[Signature] = []
    for s in sigs:
        flat.extend([s] if isinstance(s, Signature) else s)
    return Group(flat)


def periodic(cron: str, **options: Any) -> Callable[[Callable[..., Any]], Task[Any]]:
    """`@periodic(cron="*/5 * * * *")`: a task (`@task`'s options) with a cron, registered by `client.schedule(fn)`
    or `piloop schedule add NAME --task module:fn`; each tick queues it once, with no arguments."""

    def wrap(fn: Callable[..., Any]) -> Task[Any]:
        t: Task[Any] = task(**options)(fn)
        t.cron = cron
        return t

    return wrap


def schedule(client: Client, what: Any, *, name: str | None, cron: str | None, pool: str | None) -> Any:
    """`Client.schedule`: register `what` (a task, or a signature) to be queued at each tick of `cron` (else the
    task's own `@periodic` cron) under `name` (else the function's name, dashed)."""
    from piloop_common.protocol.schedule import ScheduleView

    sig = what if isinstance(what, Signature) else Signature(what)
    t = sig.task
    cron = cron or getattr(t, "cron", None)
    if not cron:
        raise ValueError(f"{t.name}: give cron=… or make it with @periodic(cron=…)")
    blob = client.put_blob(t.encode(sig.args, sig.kwargs))
    spec: dict[str, Any] = {"runner": "task", "argv": [t.name], "inputs": {f"args.{t.serializer}": blob}}
    if t.timeout:
        spec["timeout_seconds"] = t.timeout
    if client.code is not None:
        spec["code"] = client.push_code(client.code)
    body = {
        "name": name or t.fn.__name__.lower().replace("_", "-"),
        "cron": cron,
        "job": {"kind": t.kind, "pool": pool or t.pool, "spec": spec},
    }
    return client.api.call("POST", "/v1/schedules", body, model=ScheduleView)


__all__ = ["Chain", "Group", "GroupResult", "Signature", "chain", "group", "periodic"]
