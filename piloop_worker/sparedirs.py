"""Spare job dirs: a reported job's data dir emptied and kept for the next job, so a job makes and frees no
directory of its own (`JobDir.create` takes one, `JobDir.remove` gives one back)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

KEPT = ("work", "outputs", "inputs")  # a spare's directories, emptied


class SpareDirs:
    """Job data dirs emptied down to their `work/`, `outputs/` and `inputs/`, kept in `<dir>/jobs/.spare/` for the next
    jobs (a job without inputs may so find an empty `inputs/`).

    On a disk each directory made and removed costs a block allocated and freed (and, mounted with `discard`, a
    discard sent to the device); three per job were most of what the job dirs cost. A dir is given back only after its job's exit record, when the shim has killed and reaped
    every process of the job, so nothing of the old job writes there; what the job left is removed first, and a dir
    that cannot be emptied, or whose directories grew large (ext4's never shrink), is removed as before. Its
    `output.log` is kept, emptied: on a disk without a journal each inode made searches past every one freed in the
    last half minute, and the log was one of the four a task made and freed.
    """

    MOST = 16  # about a worker's slots: more is memory of dirs nobody takes
    LARGEST = 64 * 1024  # bytes of a directory's own entries: past it, a fresh one is cheaper to search

    def __init__(self, workdir: Path) -> None:
        self.root = workdir / "jobs" / ".spare"
        rmtree(self.root, ignore_errors=True)  # an earlier worker's: in whatever state it left them
        self.root.mkdir(parents=True, mode=0o777)
        # what mkdir makes of 0o777 under this process's umask: a spare's work/ and outputs/ get it back
        self.mode = stat.S_IMODE(self.root.stat().st_mode)
        # the worker's alone: a job run as another user (`jobuser`) reaches its own dir through its cwd only, and
        # none of its neighbours' nor the spares (a file planted in one would be the next job's)
        for d in (self.root, self.root.parent):
            os.chmod(d, 0o700)
        self.free: list[Path] = []
        self.made = 0

    def take(self, dest: Path) -> bool:
        """Move a spare to `dest`; whether there was one."""
        while self.free:
            p = self.free.pop()
            try:
                os.rename(p, dest)
                os.utime(dest)  # `scan` orders job dirs by it
                return True
            except OSError:
                rmtree(p, ignore_errors=True)
        return False

    def give(self, root: Path) -> bool:
        """Empty `root` down to its `work/`, `outputs/` and `inputs/` and keep it; whether it was kept (else left as
        it is)."""
        if len(self.free) >= self.MOST:
            return False
        try:
            kept = 0
            with os.scandir(root) as entries:
                for e in entries:
                    if e.name in KEPT and e.is_dir(follow_symlinks=False):
                        st = e.stat(follow_symlinks=False)
                        if st.st_size > self.LARGEST:
                            return False
                        with os.scandir(e.path) as inside:
                            for f in inside:
                                _remove(f)
                        if stat.S_IMODE(st.st_mode) != self.mode:
                            os.chmod(e.path, self.mode)
                        if st.st_uid != os.geteuid():  # a job's run as another user (`jobuser.hand_over`)
                            os.lchown(e.path, os.geteuid(), os.getegid())
                        kept += e.name != "inputs"  # made for a job's first input: a spare may have it or not
                    elif e.name == "output.log" and _truncate_own(e):
                        pass  # kept empty: the next job appends to it, and no inode is made and freed a job
                    else:
                        _remove(e)
            if kept != 2:
                return False
            os.chmod(root, 0o700)
            dest = self.root / str(self.made)
            self.made += 1
            os.rename(root, dest)
        except OSError:
            return False
        self.free.append(dest)
        return True


def _truncate_own(e: os.DirEntry[str]) -> bool:
    """Empty a regular file that has no other name (a job's hard link to a file elsewhere is removed, not emptied);
    whether it was."""
    st = e.stat(follow_symlinks=False)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        return False
    if st.st_size:
        os.truncate(e.path, 0)
    return True


def _remove(e: os.DirEntry[str]) -> None:
    if e.is_dir(follow_symlinks=False):
        rmtree(e.path)
    else:
        os.unlink(e.path)


def rmtree(path: str | Path, ignore_errors: bool = False) -> None:
    # shutil imported here, not at the top: the shim host imports this module, and shutil brings zlib, bz2 and lzma,
    # whose libraries each task's fork copies the mappings of (docs/performance.md)
    import shutil

    shutil.rmtree(path, ignore_errors=ignore_errors)
