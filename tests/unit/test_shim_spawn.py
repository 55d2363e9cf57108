"""How a shim spawns a process job: through setpriv where it has one (a vfork), else a `preexec_fn` (a fork)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from piloop_worker import spawning


@pytest.fixture
def fresh_lookup():
    spawning.setpriv_path.cache_clear()
    yield
    spawning.setpriv_path.cache_clear()


def test_setpriv_is_found_on_path_and_not_without_it(fresh_lookup, monkeypatch, tmp_path):
    if shutil.which("setpriv") is None:
        pytest.skip("no setpriv on this machine")
    assert spawning.setpriv_path() == shutil.which("setpriv")
    spawning.setpriv_path.cache_clear()
    monkeypatch.setenv("PATH", str(tmp_path))
    assert spawning.setpriv_path() is None


def test_a_setpriv_that_cannot_set_the_signal_is_not_used(fresh_lookup, monkeypatch, tmp_path):
    fake = tmp_path / "setpriv"
    fake.write_text("#!/bin/sh\necho 'setpriv: unrecognized option --pdeathsig' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert spawning.setpriv_path() is None


def test_a_program_is_found_as_subprocess_would_find_it(tmp_path):
    env = {"PATH": os.defpath}
    assert spawning.found("true", env, tmp_path) == "true"
    assert spawning.found("/bin/true", env, tmp_path) == "/bin/true"
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    assert spawning.found("./run.sh", env, tmp_path) == "./run.sh"
    for missing in ("no-such-program", "./nope.sh", "/no/such/program"):
        with pytest.raises(FileNotFoundError) as e:
            spawning.found(missing, env, tmp_path)
        assert e.value.filename == missing
    script.chmod(0o644)  # there but not executable: not runnable, as execvp says
    with pytest.raises(PermissionError):
        spawning.found("./run.sh", env, tmp_path)


def test_the_signal_setpriv_sets_survives_the_exec(tmp_path, fresh_lookup):
    """The job runs with SIGKILL as its parent-death signal, read back through prctl(PR_GET_PDEATHSIG) in the job."""
    helper = spawning.setpriv_path()
    if helper is None:
        pytest.skip("no setpriv on this machine")
    probe = (
        "import ctypes, ctypes.util, signal; libc = ctypes.CDLL(None); v = ctypes.c_int();"
        "libc.prctl(2, ctypes.byref(v), 0, 0, 0); print(v.value == signal.SIGKILL)"
    )
    out = subprocess.run(
        [helper, "--pdeathsig", "KILL", "--", shutil.which("python3") or "python3", "-c", probe],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "True"
