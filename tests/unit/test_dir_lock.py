"""The worker's hold on its directory (`piloop_worker.dirlock`): exclusive, naming its holder, never kept by a fork."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

from piloop_common.errors import DirInUse
from piloop_worker.dirlock import LOCK_NAME, hold_dir


def _free(lock: Path) -> bool:
    fd = os.open(lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def test_a_dir_held_refuses_a_second_hold_naming_the_holder_until_released(tmp_path: Path) -> None:
    where = tmp_path / "made" / "here"
    held = hold_dir(where)
    assert (where / LOCK_NAME).read_text() == f"{os.getpid()}\n" and not _free(where / LOCK_NAME)
    # the same dir by another path is the same lock
    (tmp_path / "link").symlink_to(tmp_path / "made")
    with pytest.raises(DirInUse) as e:
        hold_dir(tmp_path / "link" / "here")
    assert e.value.message == f"{where} is in use by worker pid {os.getpid()} (one worker per directory)"
    assert e.value.details == {"dir": str(where), "pid": os.getpid()}
    held.release()
    assert _free(where / LOCK_NAME)
    hold_dir(where).release()


def test_a_waiting_hold_says_so_once_then_gives_up_at_its_deadline(tmp_path: Path) -> None:
    held = hold_dir(tmp_path)
    told: list[tuple[Path, int]] = []
    with pytest.raises(DirInUse):
        hold_dir(tmp_path, wait=0.3, on_wait=lambda d, pid: told.append((d, pid)))
    assert told == [(tmp_path.resolve(), os.getpid())]
    held.release()


def test_a_forked_child_does_not_keep_the_lock_after_its_parent_lets_go(tmp_path: Path) -> None:
    held = hold_dir(tmp_path)
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child lives on (as a shim outlives its worker) until the parent says
        os.close(go_w)
        os.write(ready_w, b"x")  # past the fork's handlers: from here on it is what it will stay
        os.read(go_r, 1)
        os._exit(0)
    for fd in (ready_w, go_r):
        os.close(fd)
    try:
        assert os.read(ready_r, 1) == b"x"
        held.release()  # the parent's end: what the kernel does when a worker dies
        assert _free(tmp_path / LOCK_NAME)  # though the child, forked while it was held, still runs
    finally:
        os.close(go_w)
        os.close(ready_r)
        os.waitpid(pid, 0)
