"""A task's exception classes by name: the one spelling the worker reports (its MRO, `ReportRequest.error`) and
`retry_on` names (`JobSpec.retry_on`), so report.lua compares strings. Light on purpose: the shim host imports it."""

from __future__ import annotations

# `module.Qualname`, like `builtins.OSError` or `mypkg.work.Flaky` (one defined inside a function has none)
EXCEPTION_NAME = r"^[A-Za-z_][A-Za-z0-9_.]{0,199}$"
CLASSES_MOST = 32  # the classes a report carries, and retry_on names


def qualified(cls: type[BaseException]) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def classes_of(e: BaseException) -> list[str]:
    """An exception's classes, its own first then its bases (not `object`): a subclass of a listed class matches."""
    return [qualified(c) for c in type(e).__mro__ if c is not object]
