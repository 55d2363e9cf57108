"""Chains and groups of signatures, in Celery's words where they fit.

    from piloop_common.tasks import chain, group, periodic

    add.s(2, 3)                                  # a signature: a task and its arguments, not queued yet
    chain(add.s(2, 3), double.s()).delay()       # double(add(2, 3)): double waits for add, gets its result first
    group(add.s(i, i) for i in range(10)).delay().get(timeout=60)   # [0, 2, 4, …], in order
    add.map([1, 2, 3])                           # a GroupResult: one job per item

    @periodic(cron="*/5 * * * *")                # a task with a cron; `client.schedule(report)` registers it
    def report(): ...

A chain's link is a job waiting on the one before (its spec's `after` and `pipe`): the server queues it once its
parent has succeeded, filling in the parent's result as its input `parent.<serializer>`, which the worker passes as
its first argument; a parent that fails ends every link after it `cancelled`, naming the parent. A task makes its
signatures (`sdk/tasks.py`, which imports this module; `periodic` is a task's decorator there), a group's results
are a `GroupResult` (`sdk/taskresult.py`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any, Protocol

from piloop_common.sdk.taskclient import Client
from piloop_common.sdk.taskresult import AsyncResult, GroupResult


class Queueable(Protocol):
    """What a signature calls: a task (`sdk/tasks.py`'s `Task`, which makes signatures with `.s`)."""

    name: str

    def apply_async(
        self,
        args: tuple[Any, ...] | list[Any] = (),
        kwargs: dict[str, Any] | None = None,
        *,
        client: Client | None = None,
        depends_on: list[str] | None = None,
        pipe: tuple[str, str] | None = None,
    ) -> AsyncResult[Any]: ...

    def schedule_job(
        self,
        client: Client,
        *,
        cron: str | None,
        pool: str | None,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> tuple[str, str, dict[str, Any]]: ...


class Signature:
    """A task with its arguments (and options), not queued yet: `task.s(*args, **kwargs)`."""

    def __init__(self, t: Queueable, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> None:
        self.task, self.args, self.kwargs = t, tuple(args), dict(kwargs or {})

    def __repr__(self) -> str:
        shown = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs.items()]
        return f"{self.task.name}({', '.join(shown)})"

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

    def __or__(self, other: Signature | Chain) -> Chain:
        return Chain(self, *(other.links if isinstance(other, Chain) else (other,)))

    def schedule_job(self, client: Client, *, cron: str | None, pool: str | None) -> tuple[str, str, dict[str, Any]]:
        """This call as a schedule's job (`Client.schedule`)."""
        return self.task.schedule_job(client, cron=cron, pool=pool, args=self.args, kwargs=self.kwargs)


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


class Group:
    """Tasks run side by side: `group(sigs).delay()` queues them all (whole or not at all); its `GroupResult`."""

    def __init__(self, sigs: Iterable[Signature]) -> None:
        self.sigs = list(sigs)

    def delay(self) -> GroupResult:
        return self.apply_async()

    def apply_async(self, *, client: Client | None = None) -> GroupResult:
        return queue_together(self.sigs, client)


def group(*sigs: Signature | Iterable[Signature]) -> Group:
    """`group(a.s(1), b.s(2))` or `group(sig for …)`."""
    flat: list[Signature] = []
    for s in sigs:
        flat.extend([s] if isinstance(s, Signature) else s)
    return Group(flat)


def queue_together(sigs: Iterable[Signature], client: Client | None = None) -> GroupResult:
    """Queue every signature, whole or not at all: when one cannot be queued, the ones queued already are withdrawn
    and the error raised. Their `GroupResult`, in order (a group's and `Task.map`'s)."""
    results: list[AsyncResult[Any]] = []
    try:
        for sig in sigs:
            results.append(sig.apply_async(client=client))
    except BaseException:
        with contextlib.suppress(Exception):
            GroupResult(results).cancel()
        raise
    return GroupResult(results)


__all__ = ["Chain", "Group", "Signature", "chain", "group", "queue_together"]
