"""Campaign clones: how long a worker takes to clone a job's commit from a campaign's bundle of a deep repo, the
first time (its mirror empty: the whole-repo bundle read from the CAS and fetched into it) and the second time
(the mirror holds the commit: only the local clone and checkout), beside a plain `git clone` of the same repo
from a local path.

The repo: `commits` small commits (one file changed each) written by one `git fast-import` stream; its bundle is
built as the server builds a campaign's (`git bundle create --branches HEAD`, piloop_server/campaign_admin.py) and
put in a local CAS; each clone goes through the worker's own `Repos.checkout` (piloop_worker/repos.py).
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.measure import say
from piloop_common import gitrepo
from piloop_common.cas.local import LocalStore
from piloop_common.protocol.worker import CampaignJob, RepoSpec
from piloop_worker.repos import Repos


def fast_import_stream(commits: int) -> bytes:
    """`commits` commits on main, each setting `n.txt` to its number, with a mark each, in fast-import's format."""
    parts = []
    for i in range(1, commits + 1):
        data = f"{i}\n".encode()
        msg = f"commit {i}\n".encode()
        parts.append(
            b"commit refs/heads/main\nmark :%d\ncommitter bench <bench@piloop.invalid> %d +0000\n"
            % (i, 1_700_000_000 + i)
            + b"data %d\n%s" % (len(msg), msg)
            + (b"from :%d\n" % (i - 1) if i > 1 else b"")
            + b"M 100644 inline n.txt\ndata %d\n%s\n" % (len(data), data)
        )
    return b"".join(parts)


def make_repo(path: Path, commits: int) -> str:
    gitrepo.git("init", "-q", "-b", "main", str(path))
    subprocess.run(["git", "fast-import", "--quiet"], cwd=path, input=fast_import_stream(commits), check=True)
    gitrepo.git("checkout", "-q", "main", cwd=path)
    return gitrepo.git("rev-parse", "HEAD", cwd=path).strip()


def _timed(fn: Callable[[], Any]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def run(tmp: Path, commits: int) -> dict[str, Any]:
    root = tmp / "clone"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir()
    repo = root / "repo"
    made = time.perf_counter()
    head = make_repo(repo, commits)
    out: dict[str, Any] = {"commits": commits, "make_seconds": time.perf_counter() - made}
    bundle = root / "repo.bundle"
    out["bundle_seconds"] = _timed(lambda: gitrepo.bundle(repo, bundle, ["--branches", "HEAD"]))
    out["bundle_bytes"] = bundle.stat().st_size
    store = LocalStore(root / "cas")
    spec = CampaignJob(repo=RepoSpec(campaign="bench", bundle=store.put_file(bundle), commit=head))
    repos = Repos(root / "repos", store)

    def nothing_newer(have: list[str]) -> Any:
        raise AssertionError(f"the bundle holds the commit: nothing newer to fetch (have {have})")

    for i, key in enumerate(("first_seconds", "second_seconds")):
        out[key] = _timed(lambda i=i: repos.checkout(spec, root / f"job{i}", nothing_newer))
    out["git_clone_seconds"] = _timed(lambda: gitrepo.git("clone", "-q", str(repo), str(root / "plain")))
    if gitrepo.git("rev-parse", "HEAD", cwd=root / "job1").strip() != head:
        raise RuntimeError("the second clone is not at the repo's head")
    say(
        f"clone: {commits:,} commits, bundle {out['bundle_bytes'] / 2**20:.1f} MiB: first {out['first_seconds']:.2f} s, "
        f"second {out['second_seconds']:.2f} s, git clone {out['git_clone_seconds']:.2f} s"
    )
    shutil.rmtree(root, ignore_errors=True)
    return out


def rows(d: dict[str, Any], row: Callable[..., None]) -> None:
    n = d["commits"]
    for key, label in (
        ("first_seconds", "first job (mirror filled from the bundle)"),
        ("second_seconds", "second job"),
    ):
        row(
            f"campaign clone, {n:,} commits: {label}",
            "s",
            "lower",
            d[key],
            other=("git clone", d["git_clone_seconds"]),
            note=f"bundle {d['bundle_bytes'] / 2**20:.1f} MiB, built in {d['bundle_seconds']:.2f} s; git clone: a "
            "plain clone from a local path"
            if key == "first_seconds"
            else "",
        )
