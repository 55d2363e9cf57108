"""The one rule for the names a secret may have: an environment variable's name that does not shadow the
environment a job runs in.

A secret becomes a variable of its job's environment, beside the worker's own. A name that the loader, a shell,
an interpreter or piloop itself reads would change what the job runs, not only what it knows: `PATH` picks its
programs, `LD_PRELOAD` loads code into every process it starts, `PYTHONPATH` into every Python, `PILOOP_*` is how
the worker tells the job where its lease, its relay and its dirs are. Such names are refused when a secret is set,
when a job names one, and again by the worker when it builds the job's environment. The comparison ignores case.
"""

from __future__ import annotations

import re

from piloop_common.errors import BadRequest

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")

# read by the loader, a shell or an interpreter when a process starts
EXACT = frozenset(
    {
        "PATH",
        "HOME",
        "SHELL",
        "IFS",
        "ENV",
        "BASH_ENV",
        "CDPATH",
        "GCONV_PATH",
        "LOCPATH",
        "NLSPATH",
        "PERL5LIB",
        "PERL5OPT",
        "PERLLIB",
        "PERL5DB",
        "RUBYLIB",
        "RUBYOPT",
        "NODE_OPTIONS",
        "NODE_PATH",
        "JAVA_TOOL_OPTIONS",
        "_JAVA_OPTIONS",
        "JDK_JAVA_OPTIONS",
        "CLASSPATH",
    }
)
# every name beginning so: the dynamic loader's (LD_PRELOAD, LD_LIBRARY_PATH, LD_AUDIT, ...), macOS's, Python's
# (PYTHONPATH, PYTHONHOME, PYTHONSTARTUP, PYTHON_GIL, ...), and piloop's own
PREFIXES = ("LD_", "DYLD_", "PYTHON", "PILOOP_")
# secrets the server itself uses, never a job: `secret set` takes them, a job may not name them
SERVER_SECRETS = frozenset({"PILOOP_WORKER_CREDENTIAL"})

RULE = (
    "it would shadow the environment a job runs in ("
    + ", ".join(sorted(EXACT))
    + ", and names beginning "
    + ", ".join(PREFIXES)
    + ", in any case, are refused)"
)


def shadows(name: str) -> bool:
    """Whether `name`, as a variable of a job's environment, would change what the job runs."""
    upper = name.upper()
    return upper in EXACT or upper.startswith(PREFIXES)


def problem(name: str, *, server: bool = False) -> str:
    """Why `name` cannot be a secret's name ('' when it can). `server`: a secret the server uses for itself
    (`SERVER_SECRETS`), which `secret set` takes; a job's secret may never be one."""
    if not NAME.fullmatch(name or ""):
        return "use letters, digits and _, not starting with a digit (an environment variable's name), at most 128"
    if server and name in SERVER_SECRETS:
        return ""
    if shadows(name):
        if name in SERVER_SECRETS:
            return "it is the server's own credential for the workers it starts, never a job's"
        return RULE
    return ""


def check_secret_name(name: str, *, server: bool = False) -> str:
    """`name` when a secret may have it (see `problem`), else BadRequest naming the name and the rule."""
    why = problem(name, server=server)
    if why:
        shown = name if len(name) <= 80 else name[:70] + f"… ({len(name)} characters)"
        raise BadRequest(f"secret name {shown!r}: {why}")
    return name


def injectable(secrets: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """The secrets a job's environment may get, and the names refused (the worker's own check, beside the
    server's)."""
    refused = sorted(n for n in secrets if problem(n))
    return {n: v for n, v in secrets.items() if n not in refused}, refused
