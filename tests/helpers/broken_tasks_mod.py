"""A task module that cannot be imported (tests/faults/test_task_faults.py): what a worker says of a task in it."""

from __future__ import annotations

raise ImportError("broken_tasks_mod cannot be imported: it says so on purpose")
