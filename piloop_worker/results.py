"""A task's result held to [plugins.state] result_max_bytes before it is put in the CAS (the server checks it too:
`state/leases.py`)."""

from __future__ import annotations

import os

from piloop_common.bytecaps import result_refusal, task_result
from piloop_worker.jobrecord import JobRecord


def within_cap(record: JobRecord | None, files: list[tuple[str, str]], cap: int) -> tuple[list[tuple[str, str]], str]:
    """A job's output files less a task's result over `cap`, which is not put in the CAS, and why the task fails
    then ('' when its result is within the cap, or the job is no task). `record`: the job's `job.json`."""
    name = task_result(record.spec.model_dump() if record else {}, [n for n, _ in files])
    if name is None:
        return files, ""
    try:
        why = result_refusal(os.stat(dict(files)[name]).st_size, cap)
    except OSError:
        return files, ""  # the put that follows says what is wrong with it
    return ([f for f in files if f[0] != name], why) if why else (files, "")
