"""The Python API, as a program imports it: `from piloop_common.tasks import Client, task`.

These names are the public API (docs/jobs.md); they live in `piloop_common/sdk/` and this module only gathers
them, so the import path stays short and stable when the modules behind it move.
"""

from piloop_common.sdk.canvas import chain, group
from piloop_common.sdk.taskclient import Client
from piloop_common.sdk.taskoptions import TaskOptions
from piloop_common.sdk.taskresult import AsyncResult, GroupResult
from piloop_common.sdk.tasks import Task, periodic, task

__all__ = ["AsyncResult", "Client", "GroupResult", "Task", "TaskOptions", "chain", "group", "periodic", "task"]
