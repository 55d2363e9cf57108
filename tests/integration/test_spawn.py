"""`piloop_worker.spawn`: a job's process in its own group, dying with its spawner, its fds, env, cgroup and user as
given, its failures raised by name. Real processes; every test on both implementations (the C extension where it
was built, and the subprocess fallback)."""

from __future__ import annotations

import contextlib
import errno
import os
import pwd
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from piloop_worker import spawn as spawning
from piloop_worker.jobuser import JobUser
from tests.helpers.redis import wait_for
from tests.helpers.users import system_user

ENV = {"PATH": "/usr/bin:/bin"}
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["c", "python"])
def impl(request: pytest.FixtureRequest) -> str:
    if request.param not in spawning.IMPLEMENTATIONS:
        pytest.skip("piloop_worker._spawn is not built here (no C compiler or Python headers at install)")
    return str(request.param)


def _spawn(impl: str, argv: list[str], **kw: object) -> int:
    kw.setdefault("env", ENV)
    return spawning.IMPLEMENTATIONS[impl](argv, **kw)  # type: ignore[arg-type]


@pytest.fixture
def sleeper(impl: str) -> Iterator[list[int]]:
    """Pids the test started: killed and reaped at its end, whatever it asserted."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


def _status(pid: int) -> dict[str, str]:
    return _status_of(Path(f"/proc/{pid}"))


def _status_of(proc: Path) -> dict[str, str]:
    lines = (proc / "status").read_text().splitlines()
    return {k: v.strip() for k, _, v in (line.partition(":") for line in lines)}


def _gone(pid: int) -> bool:
    """Ended: no such process, or a zombie its new parent has not reaped yet."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


def test_the_child_leads_its_own_group_or_session(impl: str, sleeper: list[int]) -> None:
    pid = _spawn(impl, ["sleep", "30"])
    sleeper.append(pid)
    assert os.getpgid(pid) == pid and os.getsid(pid) == os.getsid(0)
    pid = _spawn(impl, ["sleep", "30"], new_session=True)
    sleeper.append(pid)
    assert os.getpgid(pid) == pid and os.getsid(pid) == pid


def test_signals_start_at_their_defaults_unblocked(impl: str, sleeper: list[int]) -> None:
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})
    try:
        pid = _spawn(impl, ["sleep", "30"])
    finally:
        signal.signal(signal.SIGHUP, before)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR2})
    sleeper.append(pid)
    st = _status(pid)
    # the signals a program can set; glibc keeps 32 and 33 for itself (Python cannot name them), and whatever this
    # test's process has of them (pytest's workers differ) is not the spawn's to change
    settable = sum(1 << (s - 1) for s in signal.valid_signals() if 0 < s <= 64)
    assert int(st["SigIgn"], 16) & settable == 0 and int(st["SigBlk"], 16) & settable == 0, st


def _zombies() -> list[int]:
    """This process's children that ended and were not reaped (others it has, a test run's redis-server say, live)."""
    out = []
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/children") as f:
            for pid in f.read().split():
                with contextlib.suppress(OSError), open(f"/proc/{pid}/stat") as st:
                    if st.read().rpartition(")")[2].split()[0] == "Z":
                        out.append(int(pid))
    return out


HELPER = """
import os, sys, time
from piloop_worker import spawn
from piloop_worker.jobuser import JobUser
user = JobUser(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), (int(sys.argv[3]),)) if len(sys.argv) > 1 else None
pid = spawn.spawn(["sleep", "60"], env={"PATH": "/usr/bin:/bin"}, user=user)
print(spawn.IMPLEMENTATION, pid, flush=True)
time.sleep(120)
"""


@pytest.mark.parametrize("as_user", [False, True], ids=["same user", "another user"])
def test_the_child_dies_at_once_with_the_process_that_spawned_it(impl: str, as_user: bool) -> None:
    args: list[str] = []
    if as_user:
        if os.geteuid() != 0:
            pytest.skip("only root runs a job as another user")
        u = system_user("piloop-spawn")
        args = [u.pw_name, str(u.pw_uid), str(u.pw_gid)]
    helper = subprocess.Popen(
        [sys.executable, "-c", HELPER, *args],
        env={**os.environ, spawning.ENV: impl, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert helper.stdout is not None
        which, pid = helper.stdout.readline().split()
        child = int(pid)
        assert which == impl and not _gone(child)
        if as_user:
            assert _status(child)["Uid"].split()[0] == args[1]  # the drop did not clear the parent-death signal
        helper.kill()
        helper.wait()
        wait_for(lambda: _gone(child), timeout=5, what="the spawned child to die with its spawner")
    finally:
        helper.kill()
        helper.wait()


def test_a_command_that_cannot_start_is_raised_by_name(impl: str, tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.write_text("echo hi\n")
    cases = [
        (["no-such-piloop-command"], None, "exec", errno.ENOENT),
        ([str(plain)], None, "exec", errno.EACCES),
        (["true"], tmp_path / "missing", "chdir", errno.ENOENT),
    ]
    for argv, cwd, step, code in cases:
        with pytest.raises(spawning.SpawnError) as e:
            _spawn(impl, argv, cwd=cwd)
        assert (e.value.step, e.value.errno, e.value.command) == (step, code, argv[0])
        assert argv[0] in str(e.value) and errno.errorcode[code] in str(e.value)
    assert not _zombies()  # every failed child reaped


CANNOT_BECOME = """
import os, sys
from piloop_worker import spawn
from piloop_worker.jobuser import JobUser
uid, gid = int(sys.argv[1]), int(sys.argv[2])
if os.geteuid() == 0:
    os.setgroups([]); os.setresgid(gid, gid, gid); os.setresuid(uid, uid, uid)
try:
    spawn.spawn(["true"], env={"PATH": "/usr/bin:/bin"}, user=JobUser("root", 0, 0, (0,)))
except spawn.SpawnError as e:
    print(e.step, e.errno, e)
"""


def test_a_user_it_cannot_become_is_raised_by_name(impl: str) -> None:
    u = system_user("piloop-spawn") if os.geteuid() == 0 else pwd.getpwuid(os.geteuid())
    out = subprocess.run(
        [sys.executable, "-c", CANNOT_BECOME, str(u.pw_uid), str(u.pw_gid)],
        env={**os.environ, spawning.ENV: impl, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    step, code, message = out.split(" ", 2)
    assert (step, int(code)) == ("setgroups", errno.EPERM) and "cannot start 'true'" in message


def test_the_environment_is_exactly_the_one_given_and_its_path_is_searched(impl: str, tmp_path: Path) -> None:
    prog = tmp_path / "bin" / "piloop-spawn-env"
    prog.parent.mkdir()
    prog.write_text("#!/bin/sh\nexec /usr/bin/env -0\n")
    prog.chmod(0o755)
    env = {"PATH": f"{prog.parent}:/usr/bin:/bin", "SPACED": "a b=c", "EMPTY": ""}
    assert shutil.which(prog.name) is None  # found on the job's PATH only
    out = tmp_path / "out"
    with open(out, "wb") as f:
        pid = _spawn(impl, [prog.name], env=env, stdout=f.fileno())
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    got = dict(item.partition("=")[::2] for item in out.read_text().split("\0") if item)
    got.pop("PWD", None)  # the shell sets it
    assert got == env


def test_the_three_fds_are_given_the_passed_ones_kept_and_nothing_else_leaks(impl: str, tmp_path: Path) -> None:
    src = tmp_path / "in"
    src.write_text("from stdin\n")
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    extra_r, extra_w = os.pipe()
    stray_r, stray_w = os.pipe()
    os.set_inheritable(stray_w, True)  # inheritable, not passed: still closed in the child
    # through /proc: dash takes no fd above 9 in a redirection
    script = f"cat; echo to-stderr >&2; echo passed >/proc/$$/fd/{extra_w}; ls /proc/$$/fd"
    with open(src, "rb") as stdin:
        pid = _spawn(impl, ["sh", "-c", script], stdin=stdin.fileno(), stdout=out_w, stderr=err_w, pass_fds=(extra_w,))
    for fd in (out_w, err_w, extra_w, stray_r, stray_w):
        os.close(fd)
    try:
        got = {name: _read_all(fd) for name, fd in (("out", out_r), ("err", err_r), ("extra", extra_r))}
        os.waitpid(pid, 0)
    finally:
        for fd in (out_r, err_r, extra_r):
            os.close(fd)
    lines = got["out"].split()
    assert lines[:2] == ["from", "stdin"]
    fds = {int(x) for x in lines[2:]}
    assert fds == {0, 1, 2, extra_w}
    assert got["err"] == "to-stderr\n" and got["extra"] == "passed\n"


def _read_all(fd: int) -> str:
    chunks = []
    while chunk := os.read(fd, 4096):
        chunks.append(chunk)
    return b"".join(chunks).decode()


def _cgroup2() -> Path | None:
    for line in Path("/proc/mounts").read_text().splitlines():
        _dev, where, kind, *_ = line.split()
        if kind == "cgroup2":
            return Path(where)
    return None


def test_the_child_is_born_in_the_cgroup_given(impl: str, sleeper: list[int]) -> None:
    top = _cgroup2()
    if top is None:
        pytest.skip("no cgroup v2 hierarchy mounted here")
    group = top / f"piloop-spawn-{uuid.uuid4().hex[:8]}"
    try:
        group.mkdir()
    except OSError as e:
        pytest.skip(f"cgroup v2 at {top} is not writable here: {e}")
    try:
        procs = os.open(group / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC)
        try:
            pid = _spawn(impl, ["sleep", "30"], cgroup_procs=procs)
        finally:
            os.close(procs)
        sleeper.append(pid)
        assert f"0::/{group.relative_to(top)}" in Path(f"/proc/{pid}/cgroup").read_text().splitlines()
        assert f"0::/{group.relative_to(top)}" not in Path("/proc/self/cgroup").read_text().splitlines()
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        sleeper.remove(pid)
    finally:
        wait_for(lambda: not (group / "cgroup.procs").read_text().strip(), timeout=5, what="the cgroup to empty")
        group.rmdir()


def test_root_drops_to_the_user_with_its_groups_and_no_new_privileges(impl: str, sleeper: list[int]) -> None:
    if os.geteuid() != 0:
        pytest.skip("only root runs a job as another user")
    u = system_user("piloop-spawn")
    user = JobUser(u.pw_name, u.pw_uid, u.pw_gid, tuple(os.getgrouplist(u.pw_name, u.pw_gid)))
    idle = threading.Event()
    other = threading.Thread(target=idle.wait, name="a thread of the spawner")
    other.start()
    try:
        pid = _spawn(impl, ["sleep", "30"], user=user)
        sleeper.append(pid)
        # the child's ids only: glibc's set*id wrappers would change every thread of the process they think they
        # are in, and a vfork'd child runs in its parent's memory
        for task in Path("/proc/self/task").iterdir():
            assert _status_of(task)["Uid"].split() == ["0"] * 4, f"thread {task.name} of the spawner changed user"
    finally:
        idle.set()
        other.join()
    st = _status(pid)
    assert st["Uid"].split() == [str(u.pw_uid)] * 4 and st["Gid"].split() == [str(u.pw_gid)] * 4
    assert {int(g) for g in st["Groups"].split()} == set(user.groups)
    assert st["NoNewPrivs"] == "1"


def test_five_hundred_spawns_leave_no_zombie_and_no_fd(impl: str) -> None:
    before = sorted(os.listdir("/proc/self/fd"))
    devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    try:
        for _ in range(500):
            pid = _spawn(impl, ["true"], stdin=devnull, stdout=devnull, stderr=devnull)
            assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    finally:
        os.close(devnull)
    assert sorted(os.listdir("/proc/self/fd")) == before
    assert not _zombies()


def test_the_extension_is_built_where_a_compiler_and_headers_are() -> None:
    headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if shutil.which("cc") is None or not headers.exists():
        pytest.skip("no C compiler or no Python.h here: the install falls back to subprocess")
    assert "c" in spawning.IMPLEMENTATIONS, "pip install built no piloop_worker._spawn though it could have"
    expected = "python" if os.environ.get(spawning.ENV) == "python" else "c"
    assert expected == spawning.IMPLEMENTATION
