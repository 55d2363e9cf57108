"""A task's result held to [plugins.state] result_max_bytes before it is put in the CAS (the server checks it too:
`state/leases.py`), and carried in the report instead when it is small (`bytecaps.INLINE_MAX_BYTES`)."""

from __future__ import annotations

import os

from piloop_common.bytecaps import INLINE_MAX_BYTES, inline, result_refusal, task_result
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


def carried(record: JobRecord | None, files: list[tuple[str, str]]) -> tuple[list[tuple[str, str]], dict[str, str]]:
    """A task's result of at most INLINE_MAX_BYTES taken out of its output files, to ride in its report (name ->
    base64): the files the CAS still takes, and the inline ones. Any other job's files are all the CAS's."""
    name = task_result(record.spec.model_dump() if record else {}, [n for n, _ in files])
    if name is None:
        return files, {}
    path = dict(files)[name]
    try:
        if os.stat(path).st_size > INLINE_MAX_BYTES:
            return files, {}
        with open(path, "rb") as f:
            data = inline(f.read())
    except OSError:
        return files, {}  # the put that follows says what is wrong with it
    if data is None:
        return files, {}
    return [f for f in files if f[0] != name], {name: data}
