"""The few git commands campaigns need, run as subprocesses with a clear error when one fails.

Both sides use them: the server keeps each campaign's bare repo and builds its bundles; a worker keeps one bare
mirror per campaign, fetches bundles into it and clones each job's worktree from it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from piloop_common.errors import PiloopError

SHA = re.compile(r"^[0-9a-f]{40}$")


class GitError(PiloopError):
    code = "git"
    status = 400


def _env() -> dict[str, str]:
    # never prompt for credentials (a daemon has no terminal), never read a pager or an editor
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_PAGER": "cat", "GIT_EDITOR": "true", "LC_ALL": "C"}
    env.pop("GIT_DIR", None)
    env.pop("GIT_WORK_TREE", None)
    return env


def git(*args: str, cwd: str | os.PathLike[str] | None = None, check: bool = True, timeout: float = 600) -> str:
    """Run `git args…`; its stdout, or GitError with git's own last line of stderr."""
    if shutil.which("git") is None:
        raise GitError("git is not installed on this host: campaigns need it (apt-get install git)")
    p = subprocess.run(
        ["git", *args], cwd=cwd, env=_env(), stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout
    )
    if check and p.returncode != 0:
        last = (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]
        raise GitError(f"git {args[0]}: {last}")
    return p.stdout


def has_commit(repo: Path, sha: str) -> bool:
    if not (repo / "HEAD").exists() and not (repo / ".git").exists():
        return False
    return (
        subprocess.run(
            ["git", "cat-file", "-e", f"{sha}^{{commit}}"],
            cwd=repo,
            env=_env(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
        ).returncode
        == 0
    )


def tips(repo: Path) -> list[str]:
    """The commits the repo's branches point at (what a fetch can say it already has)."""
    out = git("for-each-ref", "--format=%(objectname)", "refs/heads", cwd=repo)
    return sorted({line for line in out.split() if SHA.match(line)})


def bundle(repo: Path, dest: Path, refs: list[str]) -> bool:
    """Write a bundle of `refs` (e.g. `--all`, `HEAD`, `^<sha>` to leave out what a reader has); False when empty."""
    p = subprocess.run(
        ["git", "bundle", "create", str(dest), *refs],
        cwd=repo,
        env=_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
    )
    if p.returncode != 0:
        if "empty bundle" in p.stderr:
            return False
        last = (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]
        raise GitError(f"git bundle: {last}")
    return True


def init_bare(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    if not (path / "HEAD").exists():
        git("init", "-q", "--bare", str(path))


def fetch_bundle(repo: Path, bundle_path: Path, refspec: str = "refs/*:refs/*") -> None:
    # a bundle made with `^<sha>` needs those commits in the repo already: git checks and says so
    git("fetch", "-q", "--no-tags", "--update-head-ok", str(bundle_path), refspec, cwd=repo)
