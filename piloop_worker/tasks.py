"""What a task's process needs to run a Python function (`slots/taskproc.py` runs it): its target resolved, its
module imported, its value serialized, and the one line for a module that cannot be imported.

A task job's spec has `runner = "task"`, `argv = ["module:function"]`, and one input, `args.json` or
`args.pickle` (`{"args": [...], "kwargs": {...}}`; inline in the spec when small, else in the CAS). The slot's
supervisor forks (never execs) its task process, which imports the module (the supervisor has often imported it
already), calls the function, and sends its value back inline (`{"value": ...}` as JSON, or a pickle); an exception
prints its traceback to the job's log and fails the job with its classes. A module that cannot be imported is one
line instead (`unimportable`), the job's reason.

Where modules come from (docs/jobs.md, "Where task code comes from"): a shipped code dir first (`req.code`, on the
job's PYTHONPATH), then the tasks path (`[plugins.tasks] path`, `--tasks-path`: `use_path`, in the supervisor, before
any fork), then the worker's start dir and PYTHONPATH, as Python puts them.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import pickle
import sys
from pathlib import Path
from typing import Any, Protocol

SERIALIZERS = ("json", "pickle")
FAILED = 1
CRASHED = 70  # the runner itself could not start (EX_SOFTWARE)
PATH_ENV = "PILOOP_TASKS_PATH"  # the tasks path, from the worker to its slots' supervisors
START_ENV = "PILOOP_START_DIR"  # the dir the worker started in, likewise
REASON_MAX = 1000

TASKS_PATH: list[str] = []  # the tasks path, as the supervisor put it on sys.path (`use_path`)
START_DIR = os.getcwd()  # the dir the worker started in (`use_start`), on sys.path as `python -m` puts a cwd


class TaskRequest(Protocol):
    """What a task's start reads of its request (`slots.wire.SlotRequest`)."""

    @property
    def env(self) -> dict[str, str]: ...
    @property
    def code(self) -> str | None: ...
    @property
    def worker(self) -> str: ...


def use_start(raw: str) -> None:
    """In a slot's supervisor, which starts in its slot's dir: the worker's start dir in that dir's place on
    sys.path, where `python -m` put it, as if the supervisor had started where the worker did."""
    global START_DIR
    if not raw:
        return
    here = os.getcwd()
    sys.path[:] = [raw if p in (here, "") else p for p in sys.path]
    START_DIR = raw


def use_path(raw: str) -> None:
    """In a slot's supervisor, before its first fork: the tasks path (`os.pathsep`-separated) first on sys.path."""
    global TASKS_PATH
    TASKS_PATH = [os.path.abspath(p) for p in raw.split(os.pathsep) if p]
    sys.path[0:0] = [p for p in TASKS_PATH if p not in sys.path]


def module_of(target: str) -> str:
    return target.partition(":")[0]


def preload(target: str) -> bool:
    """Import a task's module in the shim host, so every task forked after it starts warm; whether this imported it
    now. Where the import fails, the task's own process imports it again and its log shows why."""
    name = module_of(target)
    if not name or name in sys.modules:
        return False
    with contextlib.suppress(BaseException):
        importlib.import_module(name)
    return True


def resolve(target: str) -> Any:
    module, sep, qualname = target.partition(":")
    if not sep or not module or not qualname:
        raise ValueError(f"task {target!r}: write module:function")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def shadowed(code: str) -> list[str]:
    """The modules already imported (by the host, for tasks without code) that the code dir `code` has its own
    version of: a task of shipped code must import those from its code, not find the host's in sys.modules."""
    tops = {p.name.removesuffix(".py") for p in Path(code).iterdir() if p.is_dir() or p.suffix == ".py"}
    tops -= set(sys.stdlib_module_names) | {"piloop_common", "piloop_worker", "piloop_server"}
    return [m for m in sys.modules if m.partition(".")[0] in tops]


def unimportable(target: str, e: ModuleNotFoundError, req: TaskRequest) -> str | None:
    """One line naming the module, the worker and the path searched, when `e` is the task's module (or a package
    above it) not found; None for a module the task's own code imports (a traceback says more there)."""
    module = module_of(target)
    if not e.name or not (module == e.name or module.startswith(e.name + ".")):
        return None
    pythonpath = [p for p in req.env.get("PYTHONPATH", "").split(os.pathsep) if p]
    path = list(dict.fromkeys([*pythonpath, *TASKS_PATH, START_DIR]))
    return (
        f"task module {module!r} cannot be imported on worker {req.worker or '?'}: no module named {e.name!r} on its "
        f"path {os.pathsep.join(path)} (see [plugins.tasks] path, --tasks-path, Client(code=…))"
    )[:REASON_MAX]


def dump_result(ser: str, value: Any) -> bytes:
    return json.dumps({"value": value}).encode() if ser == "json" else pickle.dumps(value)


def enter_task(req: TaskRequest) -> None:
    """The Python side of a task's start, in its process (a fresh fork or a warm one, `warm.py`): its PYTHONPATH
    first on sys.path, its shipped code's modules imported anew, its output line-buffered."""
    for p in reversed([p for p in req.env.get("PYTHONPATH", "").split(os.pathsep) if p]):
        if p not in sys.path:
            sys.path.insert(0, p)
    if req.code:
        for name in shadowed(req.code):
            del sys.modules[name]
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            if isinstance(stream, io.TextIOWrapper):  # as Python made it (a replaced stream may not reconfigure)
                stream.reconfigure(line_buffering=True)  # lines reach the log (and `piloop attach`) as printed
