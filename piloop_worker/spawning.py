"""How a shim finds what it spawns: util-linux's setpriv (the job's parent-death signal without a fork of the
shim, docs/worker.md) and the job's program on its PATH, as execvp would. Without `shutil`, whose imports (bz2, lzma)
every fork of the shim host would copy (test_worker_parts)."""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path


@functools.cache
def setpriv_path() -> str | None:
    """util-linux's setpriv (2.33+, which has --pdeathsig), or None: then a `preexec_fn` sets the signal."""
    path = on_path("setpriv", os.environ.get("PATH", os.defpath))
    if path is None:
        return None
    probe = subprocess.run([path, "--pdeathsig", "KILL", "--", "/bin/true"], capture_output=True, check=False)
    return path if probe.returncode == 0 else None


def found(program: str, env: dict[str, str], cwd: Path) -> str:
    """`program` as the job will run it, or FileNotFoundError as subprocess would raise it: so a job that names no
    program fails with the shim's own `cannot start` line, not setpriv's."""
    if "/" in program:
        where = cwd / program
        if os.access(where, os.X_OK) and where.is_file():
            return program
        if where.exists():
            raise PermissionError(13, "Permission denied", program)
    elif on_path(program, env.get("PATH", os.defpath)) is not None:
        return program
    raise FileNotFoundError(2, "No such file or directory", program)


def on_path(name: str, path: str) -> str | None:
    """`name`'s first executable file on `path`, as execvp searches it: `shutil.which` without `shutil`, whose
    imports (bz2, lzma) every fork of the shim host would copy (test_worker_parts)."""
    for d in path.split(os.pathsep):
        found = os.path.join(d or ".", name)
        if os.access(found, os.X_OK) and os.path.isfile(found):
            return found
    return None
