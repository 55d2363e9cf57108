"""`AsyncResult`, a submitted task's handle, and `GroupResult`, a group's; `AsyncResult`, in Celery's words (`.get`, `.ready`, `.successful`, `.state`, `.result`,
`.traceback`, `.cancel`, `.id`), read through the API (the job's view, its outputs from the server's CAS).

`AsyncResult(job_id, client=…)` re-attaches to a job submitted earlier, or elsewhere: its serializer is read from
the job's spec. `.state` is the job's piloop state (`queued`, `running`, `succeeded`, `failed`, `expired`, …;
docs/jobs.md maps Celery's).
"""

from __future__ import annotations

import base64
import json
import pickle
import time
from typing import Any, Generic, TypeVar

from piloop_common.errors import Conflict, TaskFailed, TaskRevoked, WaitTimeout
from piloop_common.protocol.operator import JobView
from piloop_common.protocol.worker import TERMINAL_STATES
from piloop_common.sdk.client import part
from piloop_common.sdk.taskclient import Client

R = TypeVar("R")
REVOKED = ("cancelled", "expired")  # withdrawn before it ran to its end: TaskRevoked


class AsyncResult(Generic[R]):
    """A submitted task: `.get()` waits for it and gives its value, or raises `TaskFailed` naming the remote
    exception's class and message (with its traceback), `TaskRevoked` when it was cancelled or expired."""

    parents: list[AsyncResult[Any]]  # a chain's last link only (canvas.Chain): the links before it, first first

    def __init__(self, id: str, client: Client | None = None, serializer: str | None = None) -> None:
        if client is None:
            client = Client.from_env()
        self.id, self.client, self._serializer = id, client, serializer
        self._ended: JobView | None = None  # the view once the job ended: it never changes again
        self._error: dict[str, Any] | None = None

    def __repr__(self) -> str:
        return f"<AsyncResult {self.id}>"

    # -- reading -------------------------------------------------------------------------------
    def _view(self) -> JobView:
        if self._ended is not None:
            return self._ended
        view = self.client.show(self.id)
        if view.state in TERMINAL_STATES:
            self._ended = view
        return view

    @property
    def serializer(self) -> str:
        if self._serializer is None:
            spec = self._view().spec
            names = {*(spec.get("inputs") or {}), *(spec.get("inline_inputs") or {})}
            self._serializer = "pickle" if "args.pickle" in names else "json"
        return self._serializer

    @property
    def state(self) -> str:
        return self._view().state

    def ready(self) -> bool:
        """Whether the job has ended, however it ended."""
        return self.state in TERMINAL_STATES

    def successful(self) -> bool:
        return self.state == "succeeded"

    def failed(self) -> bool:
        return self.ready() and not self.successful()

    def _error_record(self, view: JobView) -> dict[str, Any]:
        """The task's `error.json` (type, classes, message, traceback), or {} (it raised nothing, or never ran)."""
        if self._error is None:
            outputs = view.result.outputs
            self._error = json.loads(self.client.get_blob(outputs["error.json"])) if "error.json" in outputs else {}
        return self._error

    @property
    def traceback(self) -> str | None:
        """The task's formatted traceback, from its report; None unless it ended raising."""
        view = self._view()
        if view.state not in TERMINAL_STATES or view.state == "succeeded":
            return None
        return self._error_record(view).get("traceback") or None

    @property
    def result(self) -> R | BaseException | None:
        """Celery's `.result`: the value once it succeeded, the exception `.get()` would raise once it ended
        otherwise, None while it runs or waits."""
        view = self._view()
        if view.state not in TERMINAL_STATES:
            return None
        try:
            return self._outcome(view)
        except TaskFailed as e:
            return e

    # -- acting --------------------------------------------------------------------------------
    def get(self, timeout: float | None = None) -> R:
        """Wait for the job to end (`WaitTimeout` after `timeout` s) and give its value."""
        view = self._ended or self.client.wait(self.id, timeout)
        self._ended = view
        return self._outcome(view)

    def cancel(self) -> str:
        """Cancel it: at once while queued, at its worker's next heartbeat while running; the state it is in now
        (`cancelled` or `cancelling`). A job that has already ended is a Conflict."""
        got = self.client.api.call("POST", f"/v1/jobs/{part(self.id)}/cancel")
        return str(got["state"])

    revoke = cancel  # Celery's name

    def _outcome(self, view: JobView) -> R:
        outputs = view.result.outputs
        if view.state == "succeeded":
            name = f"result.{self.serializer}"
            carried = view.result.inline_outputs.get(name)  # a small result, kept with the job: no CAS
            raw = base64.b64decode(carried) if carried is not None else self.client.get_blob(outputs[name])
            value: R = json.loads(raw)["value"] if self.serializer == "json" else pickle.loads(raw)
            return value
        if view.state in REVOKED:
            raise TaskRevoked(
                f"task {self.id} {view.state}: {view.reason or view.state}", job=self.id, state=view.state
            )
        error = self._error_record(view)
        tb = error.get("traceback") or self.client.log(self.id).decode(errors="replace")
        classes = error.get("classes") or [error.get("type", "")]
        raised = str(classes[0]).removeprefix("builtins.") if error else ""
        what = f"{raised}: {error['message']}" if error else (view.reason or view.state)
        raise TaskFailed(
            f"task {self.id} {view.state}: {what}\n{tb}".rstrip(),
            job=self.id,
            state=view.state,
            reason=view.reason,
            error_type=raised,
            traceback=tb,
        )


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
        out = {}
        for r in self.results:
            try:
                out[r.id] = str(r.client.api.call("POST", f"/v1/jobs/{part(r.id)}/cancel")["state"])
            except Conflict:  # it had ended
                out[r.id] = r.state
        return out
