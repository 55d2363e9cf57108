"""The task runner: a Python function run in a process forked from the worker's warm interpreter.

A task job's spec has `runner = "task"`, `argv = ["module:function"]`, and one input, `args.json` or
`args.pickle` (`{"args": [...], "kwargs": {...}}`; inline in the spec when small, which the job's start writes from
the claim's answer without the CAS). The shim forks (never execs) a child that calls `run`:
it imports the module (the shim host has usually imported it already, so this costs nothing), calls the
function, and writes its value to `outputs/result.json` (`{"value": ...}`) or `outputs/result.pickle`.
An exception prints its traceback to the job's log, writes `outputs/error.json`, and exits 1. A module that cannot
be imported is one line instead (`unimportable`), which the shim makes the job's reason.

Where modules come from (docs/jobs.md, "Where task code comes from"): a shipped code dir first (`req.code`, on the
job's PYTHONPATH), then the tasks path (`[plugins.tasks] path`, `--tasks-path`: `use_path`, in the host, before any
fork), then the worker's start dir and PYTHONPATH, as Python puts them.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import pickle
import re
import signal
import sys
from pathlib import Path
from typing import Any, Protocol

from piloop_common.exceptionnames import CLASSES_MOST, EXCEPTION_NAME, classes_of
from piloop_common.files import write_file
from piloop_common.prctl import die_with_parent
from piloop_worker import jobuser
from piloop_worker.jobdir import JobDir
from piloop_worker.shimproto import ShimRequest

SERIALIZERS = ("json", "pickle")
FAILED = 1
CRASHED = 70  # the runner itself could not start (EX_SOFTWARE)
PATH_ENV = "PILOOP_TASKS_PATH"  # the tasks path, from the worker to its shim host
REASON_MAX = 1000

TASKS_PATH: list[str] = []  # the tasks path, as the host put it on sys.path (`use_path`)
START_DIR = os.getcwd()  # the dir the worker (and so the host) started in, on sys.path as Python put it there


class TaskRequest(Protocol):
    """What a task's start reads of its request: a shim's (`ShimRequest`) or a slot's (`slots.wire.SlotRequest`)."""

    @property
    def env(self) -> dict[str, str]: ...
    @property
    def code(self) -> str | None: ...
    @property
    def worker(self) -> str: ...


def use_path(raw: str) -> None:
    """In the shim host, before its first fork: the tasks path (`os.pathsep`-separated) first on sys.path."""
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


def reason(jd: JobDir) -> str:
    """The one-line reason the task's process left in `error.json`, or ''."""
    try:
        got = json.loads((jd.outputs / "error.json").read_bytes())
    except (OSError, ValueError):
        return ""
    why = got.get("reason") if isinstance(got, dict) else None
    return why.splitlines()[0][:REASON_MAX] if isinstance(why, str) and why else ""


def error_classes(jd: JobDir) -> tuple[str, ...]:
    """The classes the task's process left in `error.json` (those a report may carry), or ()."""
    try:
        got = json.loads((jd.outputs / "error.json").read_bytes())
    except (OSError, ValueError):
        return ()
    classes = got.get("classes") if isinstance(got, dict) else None
    if not isinstance(classes, list):
        return ()
    return tuple(c for c in classes if isinstance(c, str) and re.fullmatch(EXCEPTION_NAME, c))[:CLASSES_MOST]


def load_arguments(jd: JobDir) -> tuple[str, list[Any], dict[str, Any]]:
    """The serializer, args and kwargs of the call; a chain's link gets its parent's result first (the input
    `parent.json` or `parent.pickle`, the parent's `result.<serializer>`, which the server filled in)."""
    for ser in SERIALIZERS:
        path = jd.inputs / f"args.{ser}"
        if path.exists():
            raw = path.read_bytes()
            data = json.loads(raw) if ser == "json" else pickle.loads(raw)
            return ser, [*_piped(jd), *(data.get("args") or [])], dict(data.get("kwargs") or {})
    raise FileNotFoundError(f"a task needs the input args.json or args.pickle; {jd.inputs} has neither")


def _piped(jd: JobDir) -> list[Any]:
    for ser in SERIALIZERS:
        path = jd.inputs / f"parent.{ser}"
        if path.exists():
            raw = path.read_bytes()
            return [json.loads(raw)["value"] if ser == "json" else pickle.loads(raw)]
    return []


def dump_result(ser: str, value: Any) -> bytes:
    return json.dumps({"value": value}).encode() if ser == "json" else pickle.dumps(value)


def run(target: str, jd: JobDir, req: ShimRequest | None = None) -> int:
    """Call the task and write its result; the exit status of the task's process."""
    try:
        ser, args, kwargs = load_arguments(jd)
        try:
            fn = resolve(target)
        except ModuleNotFoundError as e:
            line = unimportable(target, e, req) if req is not None else None
            if line is None:
                raise
            sys.stderr.write(line + "\n")
            with contextlib.suppress(Exception):
                error = {
                    "type": "ModuleNotFoundError",
                    "classes": classes_of(e),
                    "message": line,
                    "traceback": "",
                    "reason": line,
                }
                (jd.outputs / "error.json").write_text(json.dumps(error))
            return FAILED
        value = fn(*args, **kwargs)
        data = dump_result(ser, value)
    except BaseException as e:  # noqa: BLE001 — whatever the task raised (SystemExit too) is its failure
        import traceback  # here, on a failure only: it brings linecache, tokenize and textwrap into the shim host

        tb = traceback.format_exc()
        sys.stderr.write(tb)
        with contextlib.suppress(Exception):
            (jd.outputs / "error.json").write_text(
                json.dumps({"type": type(e).__name__, "classes": classes_of(e), "message": str(e), "traceback": tb})
            )
        return FAILED
    (jd.outputs / f"result.{ser}").write_bytes(data)
    return 0


def _become(env: dict[str, str]) -> None:
    """Set the variables a job adds (`env`) over the environment this process inherited from the shim host, which is
    the worker's (`shim.job_env`): only those, since walking all of them costs a task the pages it copies."""
    for name, value in env.items():
        if os.environ.get(name) != value:
            os.environ[name] = value


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


def child(req: ShimRequest, jd: JobDir, cgroup_join: Path | None) -> None:
    """The forked task process, up to its `os._exit`: its own process group, the job's log as stdout and stderr,
    the job's env and cwd, default signals, none of the shim's descriptors (its lock above all)."""
    code = CRASHED
    shim_pid = os.getppid()
    try:
        os.setpgid(0, 0)
        if cgroup_join is not None:
            write_file(cgroup_join, str(os.getpid()))
        devnull = os.open(os.devnull, os.O_RDONLY)
        out = os.open(jd.output_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(devnull, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        os.chdir(jd.work)
        if (user := jobuser.JobUser.of(req.user)) is not None:
            jobuser.become(user)  # after its log and cgroup, which are root's
            jobuser.isolate()
            jd = JobDir(Path(os.pardir))  # its dir through its cwd: the user cannot pass the dirs above it
        die_with_parent(shim_pid, signal.SIGKILL)  # after its user is set, which clears a parent-death signal
        _become(req.env)
        enter_task(req)
        assert req.task is not None
        code = run(req.task, jd, req)
    except BaseException:  # noqa: BLE001 — the task's host reports any end as its exit status
        with contextlib.suppress(BaseException):
            import traceback

            traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(BaseException):
                stream.flush()
        os._exit(code)
