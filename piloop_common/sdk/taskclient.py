"""The job client of the Python API: blobs in the server's CAS, submit, wait, show, schedule.

    from piloop_common.tasks import Client

    client = Client.from_env()           # PILOOP_SERVER (+ PILOOP_TOKEN, PILOOP_CA), else $PILOOP_HOME's socket
    job = client.submit(argv=["make", "eval"], pool="serve")
    view = client.wait(job, timeout=600)   # the JobView once it has ended

It is the bottom of the SDK's own layers: results (`taskresult`) and tasks (`tasks`) use it, it uses neither (a
schedule's job comes from what is scheduled, through `Schedulable`).
"""

from __future__ import annotations

import datetime as dt
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

from piloop_common.cas.address import hash_bytes
from piloop_common.errors import BadRequest, Corrupt, WaitTimeout
from piloop_common.protocol.operator import JobView
from piloop_common.protocol.schedule import ScheduleView
from piloop_common.protocol.worker import PIPE_PLACEHOLDER, TERMINAL_STATES
from piloop_common.sdk.client import ApiClient, part
from piloop_common.sdk.remote import SERVER_ENV
from piloop_common.sdk.taskoptions import TaskOptions

POLL_FIRST, POLL_MAX = 0.05, 0.5


class Schedulable(Protocol):
    """What `Client.schedule` takes (a task, a signature): it says the name, the cron and the job of its schedule."""

    def schedule_job(
        self, client: Client, *, cron: str | None, pool: str | None
    ) -> tuple[str, str, dict[str, Any]]: ...


class Client:
    """The operator's side of the API, for programs: blobs, submit, wait. With `code` (a dir), every task it
    submits ships a snapshot of that dir by address, and the worker imports the task's module from it."""

    def __init__(self, api: ApiClient | None = None, *, code: str | Path | None = None) -> None:
        self.api = api if api is not None else ApiClient.from_env()
        self.code = Path(code).expanduser().absolute() if code is not None else None
        self._pushed: dict[str, tuple[Any, str]] = {}  # a dir's stats (`taskcode.signature`) and address, last push

    @classmethod
    def from_env(
        cls,
        home: Path | None = None,
        timeout: float = 30.0,
        *,
        server: str | None = None,
        token: str | None = None,
        token_file: str | Path | None = None,
        ca: str | Path | None = None,
        code: str | Path | None = None,
    ) -> Client:
        """`server`, else `PILOOP_SERVER` (https, or http on a loopback address; the token is `token`, else
        `token_file`'s first line, else `PILOOP_TOKEN`, else `PILOOP_HTTPS_TOKEN`; the server's CA `ca`, else
        `PILOOP_CA`), else the local daemon's socket under `home`, `PILOOP_HOME` or ~/.piloop. Inside a job
        (`PILOOP_RELAY` set), with no server or home given: the job's relay, so what it submits are its own children,
        in its own pool (`piloop_common.sdk.nested`)."""
        from piloop_common.sdk.nested import NestedClient, relay_path

        if not server and home is None and (relay := relay_path()) is not None:
            return cls(NestedClient(relay, timeout=timeout), code=code)
        if server:
            return cls(ApiClient.remote(server, token=token, token_file=token_file, ca=ca, timeout=timeout), code=code)
        if os.environ.get(SERVER_ENV) and (token or token_file or ca):
            url = os.environ[SERVER_ENV]
            return cls(ApiClient.remote(url, token=token, token_file=token_file, ca=ca, timeout=timeout), code=code)
        return cls(ApiClient.from_env(home, timeout=timeout), code=code)

    def close(self) -> None:
        self.api.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the server's CAS --------------------------------------------------------------------
    def put_blob(self, data: bytes) -> str:
        """Put `data` in the server's CAS; its address."""
        address = hash_bytes(data)
        self.api.call_bytes("PUT", f"/v1/cas/blobs/{address}", content=data)
        return address

    def get_blob(self, address: str) -> bytes:
        """A blob of the server's CAS, checked against its address."""
        data = self.api.call_bytes("GET", f"/v1/cas/blobs/{address}").content
        if hash_bytes(data) != address:
            raise Corrupt(f"the server sent bytes that do not hash to {address}", address=address)
        return data

    def push_code(self, root: str | Path) -> str:
        """Put a snapshot of the code dir `root` in the server's CAS (`piloop_common.sdk.taskcode`); its address."""
        from piloop_common.sdk.taskcode import pack, signature

        where, stats = str(Path(root).expanduser().absolute()), signature(root)
        if stats and (last := self._pushed.get(where)) is not None and last[0] == stats:
            return last[1]  # no file changed since this client pushed it: the server has it
        data = pack(root)
        address = hash_bytes(data)
        self.put_blob(data)
        self._pushed[where] = (stats, address)
        return address

    # -- jobs --------------------------------------------------------------------------------
    def submit(
        self,
        argv: list[str],
        *,
        pool: str = "serve",
        kind: str = "evaluation",
        env: dict[str, str] | None = None,
        inputs: dict[str, str] | None = None,
        inline_inputs: dict[str, str] | None = None,
        secrets: list[str] | None = None,
        timeout: float | None = None,
        memory_mb: int | None = None,
        image: str = "",
        campaign: str = "",
        runner: str = "process",
        memory: str | int | None = None,
        memory_growth: float | None = None,
        memory_max: str | int | None = None,
        max_attempts: int | None = None,
        backoff: float | None = None,
        code: str | None = None,
        priority: int | None = None,
        countdown: float | None = None,
        eta: dt.datetime | None = None,
        expires: float | dt.datetime | None = None,
        retry_on: Iterable[type[BaseException]] | None = None,
        job_id: str | None = None,
        depends_on: list[str] | None = None,
        pipe: tuple[str, str] | None = None,
    ) -> str:
        """Queue a job; its id. `inputs` maps a file name in the job's `inputs/` to a CAS address (`put_blob`),
        `inline_inputs` to its bytes in base64 (at most 64 KiB in all, `bytecaps.inline`).
        `memory` is its grant (`"4G"`, `"512M"`, or MiB); `max_attempts` and `backoff` (seconds) its retry policy;
        a bad value raises BadRequest before anything is queued. `code` is a code snapshot's address (`push_code`).
        `priority` (0..9, 9 first), `countdown`/`eta`, `expires` and `retry_on` are a task's (`TaskOptions`: a bad
        one is a ValueError); `job_id` its id of the caller's choosing (one that exists is a Conflict);
        `depends_on` (job ids): it waits until all have succeeded, and ends `cancelled` when one fails; `pipe` (a
        chain's parent and its serializer): that parent's result is this task's first argument."""
        from piloop_common.sizes import parse_memory

        timing = TaskOptions(
            priority=priority,
            countdown=countdown,
            eta=eta,
            expires=expires,
            retry_on=tuple(retry_on) if retry_on is not None else None,
        ).timing()
        if memory is not None and memory_mb is not None:
            raise BadRequest("memory and memory_mb: give one")
        spec: dict[str, Any] = {
            "runner": runner,
            "argv": list(argv),
            "env": dict(env or {}),
            "secrets": list(secrets or []),
            "inputs": dict(inputs or {}),
            "timeout_seconds": timeout,
            "memory_mb": parse_memory(memory, "memory") if memory is not None else memory_mb,
            **timing,
        }
        for key, value in (
            ("memory_growth", memory_growth),
            ("max_attempts", max_attempts),
            ("backoff_seconds", backoff),
            ("memory_max_mb", parse_memory(memory_max, "memory_max") if memory_max is not None else None),
            ("code", code),
            ("inline_inputs", dict(inline_inputs) if inline_inputs else None),
        ):
            if value is not None:
                spec[key] = value
        # dependencies (a chain's links: piloop_common/sdk/canvas.py)
        if depends_on:
            spec["after"] = list(dict.fromkeys(depends_on))
        if pipe is not None:
            spec["after"] = list(dict.fromkeys([*spec.get("after", []), pipe[0]]))
            spec["pipe"], spec["inputs"][f"parent.{pipe[1]}"] = pipe[0], PIPE_PLACEHOLDER
        body: dict[str, Any] = {"kind": kind, "pool": pool, "campaign": campaign, "image": image, "spec": spec}
        if job_id is not None:
            body["id"] = job_id
        return str(self.api.call("POST", "/v1/jobs", body)["job"])

    def schedule(
        self, what: Schedulable, *, name: str | None = None, cron: str | None = None, pool: str | None = None
    ) -> ScheduleView:
        """Register a periodic schedule: `what` is a task made with `@periodic(cron=…)` (or any task with `cron`),
        or a signature (`task.s(…)`); each tick queues it once, under `name` (else the function's name, dashed)."""
        default_name, cron, job = what.schedule_job(self, cron=cron, pool=pool)
        body = {"name": name or default_name, "cron": cron, "job": job}
        return self.api.call("POST", "/v1/schedules", body, model=ScheduleView)

    def show(self, job_id: str) -> JobView:
        return self.api.call("GET", f"/v1/jobs/{part(job_id)}", model=JobView)

    def wait(self, job_id: str, timeout: float | None = None) -> JobView:
        """The job's view once it has ended (any end: succeeded, failed, lost, …); `WaitTimeout` after `timeout` s."""
        end = None if timeout is None else time.monotonic() + timeout
        pause = POLL_FIRST
        while True:
            view = self.show(job_id)
            if view.state in TERMINAL_STATES:
                return view
            if end is not None and time.monotonic() + pause > end:
                raise WaitTimeout(f"{job_id} is still {view.state} after {timeout:g}s", job=job_id, state=view.state)
            time.sleep(pause)
            pause = min(pause * 2, POLL_MAX)

    def log(self, job_id: str) -> bytes:
        """The job's log as uploaded so far."""
        n = len(self.show(job_id).log)
        return b"".join(self.api.call_bytes("GET", f"/v1/jobs/{part(job_id)}/log/{i}").content for i in range(n))


__all__ = ["Client", "Schedulable"]
