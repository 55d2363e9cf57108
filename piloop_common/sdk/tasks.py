"""Tasks: Python functions that run on workers, with their signatures (`task.s(…)`), in Celery's words.

    from piloop_common.tasks import task

    @task(pool="gpu", serializer="json")
    def add(a, b):
        return a + b

    add.delay(2, 3).get(timeout=60)      # 5, computed on a worker of the pool gpu

A task's job spec names `module:function` (runner `task`) and its arguments blob, the input `args.<serializer>`:
carried in the spec itself (`inline_inputs`, base64) up to 64 KiB (`bytecaps.INLINE_MAX_BYTES`), else put in the
CAS (the API's `/v1/cas` routes) and named by its address; its value comes back through the CAS. The worker runs it in a
process forked from its warm interpreter (`piloop_worker.tasks`), and writes `result.<serializer>` as an output.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import pickle
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

from piloop_common.bytecaps import inline
from piloop_common.sdk.canvas import Signature, queue_together
from piloop_common.sdk.taskclient import Client
from piloop_common.sdk.taskoptions import TaskOptions
from piloop_common.sdk.taskresult import AsyncResult, GroupResult

R = TypeVar("R")
SERIALIZERS = ("json", "pickle")


class Task(Generic[R]):
    """A function that runs on a worker: `.delay(*args, **kw)` queues it; calling it runs it here."""

    cron: str  # an @periodic task's only (`periodic`); read with getattr

    def __init__(
        self, fn: Callable[..., R], *, kind: str, serializer: str, client: Client | None, options: TaskOptions
    ) -> None:
        if serializer not in SERIALIZERS:
            raise ValueError(f"serializer={serializer!r}: use one of {', '.join(SERIALIZERS)}")
        if "<locals>" in fn.__qualname__:
            raise ValueError(
                f"{fn.__qualname__}: a task must be defined at a module's top level, for a worker to import it"
            )
        self.fn, self.kind, self.serializer, self.options = fn, kind, serializer, options
        self._client = client  # given to @task: always this one
        self._env_client: tuple[str, Client] | None = None  # made from the environment, and the job it was made in
        self.name = f"{fn.__module__}:{fn.__qualname__}"
        self.__doc__, self.__name__, self.__module__ = fn.__doc__, fn.__name__, fn.__module__
        self.__qualname__ = fn.__qualname__

    @property
    def pool(self) -> str:
        return self.options.pool or "serve"

    @property
    def timeout(self) -> float | None:
        return self.options.timeout

    def __call__(self, *args: Any, **kwargs: Any) -> R:
        return self.fn(*args, **kwargs)

    @property
    def client(self) -> Client:
        """The client given to `@task`, else one from the environment, made again in each job: a warm task process
        (docs/worker.md) runs job after job, each with its own relay, which a client kept from the last would miss."""
        if self._client is not None:
            return self._client
        job = os.environ.get("PILOOP_JOB", "")
        if self._env_client is None or self._env_client[0] != job:
            if self._env_client is not None:
                self._env_client[1].close()
            self._env_client = (job, Client.from_env())
        return self._env_client[1]

    def delay(self, *args: Any, **kwargs: Any) -> AsyncResult[R]:
        return self.apply_async(args, kwargs)

    def encode(self, args: tuple[Any, ...] | list[Any] = (), kwargs: dict[str, Any] | None = None) -> bytes:
        """The arguments blob (`args.<serializer>`) of a call with `args` and `kwargs`."""
        payload = {"args": list(args), "kwargs": dict(kwargs or {})}
        return json.dumps(payload).encode() if self.serializer == "json" else pickle.dumps(payload)

    def apply_async(
        self,
        args: tuple[Any, ...] | list[Any] = (),
        kwargs: dict[str, Any] | None = None,
        *,
        countdown: float | None = None,
        eta: dt.datetime | None = None,
        expires: float | dt.datetime | None = None,
        priority: int | None = None,
        pool: str | None = None,
        job_id: str | None = None,
        retries: int | None = None,
        retry_backoff: float | bool | None = None,
        retry_on: tuple[type[BaseException], ...] | None = None,
        timeout: float | None = None,
        memory_gb: float | None = None,
        client: Client | None = None,
        depends_on: list[str] | None = None,
        pipe: tuple[str, str] | None = None,
    ) -> AsyncResult[R]:
        """Queue the task with `args` and `kwargs`; each option given here wins over the task's own (`@task`)."""
        if self.fn.__module__ == "__main__":
            raise ValueError(
                f"{self.fn.__qualname__} is defined in __main__: a worker cannot import it; define the task in a module"
            )
        o = TaskOptions(
            pool=pool,
            retries=retries,
            retry_backoff=retry_backoff,
            retry_on=retry_on,
            timeout=timeout,
            memory_gb=memory_gb,
            priority=priority,
            countdown=countdown,
            eta=eta,
            expires=expires,
        ).over(self.options)
        o.timing()  # a past expiry or eta: refused before the arguments are put
        c = client or self.client
        # small arguments travel in the spec (and the claim's answer); larger ones through the CAS
        blob, name = self.encode(args, kwargs), f"args.{self.serializer}"
        carried = inline(blob)
        job = c.submit(
            [self.name],
            pool=o.pool or "serve",
            kind=self.kind,
            runner="task",
            inputs={} if carried is not None else {name: c.put_blob(blob)},
            inline_inputs={name: carried} if carried is not None else None,
            timeout=o.timeout,
            memory_mb=o.memory_mb(),
            max_attempts=o.max_attempts(),
            backoff=o.backoff_seconds(),
            code=c.push_code(c.code) if c.code is not None else None,  # a snapshot now: edits since ship too
            priority=o.priority,
            countdown=o.countdown,
            eta=o.eta,
            expires=o.expires,
            retry_on=o.retry_on,
            job_id=job_id,
            depends_on=depends_on,
            pipe=pipe,
        )
        return AsyncResult(job, c, self.serializer)

    # -- signatures, groups and schedules (piloop_common/sdk/canvas.py) -------------------------------------
    def s(self, *args: Any, **kwargs: Any) -> Signature:
        """A signature: this task with these arguments, to chain, group or schedule."""
        return Signature(self, args, kwargs)

    def map(self, iterable: Iterable[Any], *, client: Client | None = None) -> GroupResult:
        """Queue this task once per item (its one argument); the `GroupResult`, in the items' order."""
        return queue_together([self.s(x) for x in iterable], client)

    def schedule_job(
        self,
        client: Client,
        *,
        cron: str | None,
        pool: str | None,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> tuple[str, str, dict[str, Any]]:
        """This task called with `args` and `kwargs` as a schedule's job: its name (the function's, dashed), its
        cron (`cron`, else the task's own `@periodic` one) and the job each tick queues (`Client.schedule`)."""
        cron = cron or getattr(self, "cron", None)
        if not cron:
            raise ValueError(f"{self.name}: give cron=… or make it with @periodic(cron=…)")
        blob = client.put_blob(self.encode(args, kwargs))
        spec: dict[str, Any] = {"runner": "task", "argv": [self.name], "inputs": {f"args.{self.serializer}": blob}}
        if self.timeout:
            spec["timeout_seconds"] = self.timeout
        if client.code is not None:
            spec["code"] = client.push_code(client.code)
        job = {"kind": self.kind, "pool": pool or self.pool, "spec": spec}
        return self.fn.__name__.lower().replace("_", "-"), cron, job


def task(
    fn: Callable[..., R] | None = None,
    *,
    pool: str = "serve",
    kind: str = "evaluation",
    serializer: str = "json",
    timeout: float | None = None,
    client: Client | None = None,
    retries: int | None = None,
    retry_backoff: float | bool | None = None,
    retry_on: tuple[type[BaseException], ...] | None = None,
    memory_gb: float | None = None,
    priority: int | None = None,
) -> Any:
    """Make a module-level function a task: `@task` or `@task(pool="gpu", retries=3, retry_on=(OSError,))`.
    A bad option is a ValueError here, at import."""
    options = TaskOptions(
        pool=pool,
        retries=retries,
        retry_backoff=retry_backoff,
        retry_on=retry_on,
        timeout=timeout,
        memory_gb=memory_gb,
        priority=priority,
    )

    def wrap(f: Callable[..., R]) -> Task[R]:
        return Task(f, kind=kind, serializer=serializer, client=client, options=options)

    return wrap(fn) if fn is not None else wrap


def periodic(cron: str, **options: Any) -> Callable[[Callable[..., Any]], Task[Any]]:
    """`@periodic(cron="*/5 * * * *")`: a task (`@task`'s options) with a cron, registered by `client.schedule(fn)`
    or `piloop schedule add NAME --task module:fn`; each tick queues it once, with no arguments."""

    def wrap(fn: Callable[..., Any]) -> Task[Any]:
        t: Task[Any] = task(**options)(fn)
        t.cron = cron
        return t

    return wrap


__all__ = ["Client", "Task", "periodic", "task"]
