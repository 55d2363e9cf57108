"""A job's files, in its slot's dir (docs/worker.md, "Job files"): made only for a job that has files.

    <dir>/slots/<n>/            $PILOOP_JOB_DIR: the slot's, made once (`slots.layout.SlotDir`)
        work/                   a process job's or a task's cwd, emptied by the supervisor at each start
        outputs/                files a process job leaves for its report (`../outputs/` from its cwd): made once,
                                emptied once a job's report took what was there
        inputs/                 a job's inputs, fetched from the CAS (or carried inline): made for a job that has some
        repo/ workspace/        a campaign job's checkout (its cwd) and an agent's workspace copy

A task's arguments and value travel inline (the supervisor's socket) and touch no file unless they are over the
inline cap. A dir is emptied with one `scandir` when the job left nothing in it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from piloop_worker.slots import SlotDir

FULL_BELOW = 1 << 20  # a dir with less room than this is full: no job starts there


class JobFiles:
    """The paths of a job's files in slot `slot`."""

    def __init__(self, slot: SlotDir) -> None:
        self.slot = slot
        self.root = slot.root
        self.inputs = slot.root / "inputs"
        self.outputs = slot.root / "outputs"
        self.repo = slot.root / "repo"
        self.workspace = slot.root / "workspace"
        self._made = False

    def prepare(self) -> None:
        """The slot's `outputs/`, made the first time (the slot's own dirs are its supervisor's)."""
        if self._made:
            return
        self.slot.make()
        self.outputs.mkdir(mode=0o755, exist_ok=True)
        self._made = True

    def empty(self) -> None:
        """What a reported job left in `outputs/`, and its inputs and checkout."""
        _empty(self.outputs)
        for d in (self.inputs, self.repo, self.workspace):
            if d.exists():
                shutil.rmtree(d, ignore_errors=True)

    def full(self) -> bool:
        """Whether the slot's filesystem is (all but) out of room."""
        try:
            st = os.statvfs(self.root if self.root.exists() else self.root.parent.parent)
        except OSError:
            return False
        return st.f_bavail * st.f_frsize < FULL_BELOW


def _empty(d: Path) -> None:
    try:
        with os.scandir(d) as it:
            left = [e.path for e in it]
    except FileNotFoundError:
        return
    for path in left:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


def files_under(root: Path) -> list[tuple[str, str]]:
    """Each file under `root`, as (its path from `root` with `/`, its path), sorted; a symlink to a file counts, a
    symlinked dir is not entered; none where `root` is not a dir."""
    found: list[tuple[tuple[str, ...], str]] = []
    me = os.geteuid()

    def walk(path: str, parts: tuple[str, ...]) -> None:
        try:
            with os.scandir(path) as it:
                entries = list(it)
        except (NotADirectoryError, FileNotFoundError, PermissionError):
            return
        for e in entries:
            if e.is_dir(follow_symlinks=False):
                walk(e.path, (*parts, e.name))
            elif e.is_file() and (not e.is_symlink() or e.stat(follow_symlinks=False).st_uid == me):
                # a symlink of another user's (a job run as one: `jobuser`) is not followed: as root, this
                # process would read whatever it points at, the worker's token file too
                found.append(((*parts, e.name), e.path))

    walk(str(root), ())
    found.sort()
    return [("/".join(parts), path) for parts, path in found]


def read_json(path: Path) -> Any | None:
    try:
        return json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
