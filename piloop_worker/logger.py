"""The worker's logger, `piloop.worker`: every worker module's `logging.getLogger("piloop.worker")` gets it, since
the worker's entry (piloop_worker/main.py) makes it before it imports any of them. Not made by the package's
`__init__`: the shim host imports the package, and imports no `logging` (each task's fork copies what it holds)."""

from __future__ import annotations

import logging

NAME = "piloop.worker"


class CallerlessLogger(logging.Logger):
    """A logger that does not look up each line's source file, line and function: the log formats
    (piloop_common/logformat.py) name none of them, and the stack walk cost ~5 µs a line on a 2-CPU box, for a few
    lines a job (the logging docs' "Optimization" does the same for every logger through a private attribute)."""

    def findCaller(self, stack_info: bool = False, stacklevel: int = 1) -> tuple[str, int, str, str | None]:
        return "(unknown file)", 0, "(unknown function)", None


def _make() -> logging.Logger:
    previous = logging.getLoggerClass()
    logging.setLoggerClass(CallerlessLogger)
    try:
        return logging.getLogger(NAME)
    finally:
        logging.setLoggerClass(previous)


log = _make()
