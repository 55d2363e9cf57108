"""Which worker runs this job, as the job itself can tell: used inside jobs (the marker job, the warm marker task)."""

from __future__ import annotations

import os


def worker_name() -> str:
    """The name of the worker running this job: its `--dir`'s name (`<home>/work/<name>`, the default) as the job's
    dir, else its cwd, shows it, else the one worker dir in the worker's home (`$PILOOP_HOME`)."""
    for path in (os.environ.get("PILOOP_JOB_DIR", ""), os.getcwd()):
        if "/work/" in path:
            return path.split("/work/")[1].split("/")[0]
    work = os.path.join(os.environ.get("PILOOP_HOME", ""), "work")
    names = sorted(os.listdir(work)) if os.path.isdir(work) else []
    return names[0] if len(names) == 1 else "?"
