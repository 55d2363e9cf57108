"""A campaign job's clone and workspace: what an agent or evaluation gets, and what an agent sends back.

The worker keeps one bare mirror per campaign under `$PILOOP_HOME/repos/<campaign>.git`. The first job of a
campaign fills it from the campaign's whole-repo bundle (built once by the server, read from the CAS); later jobs
ask the server only for what is newer than the branches the mirror holds (an incremental bundle). Each job's
worktree is a local clone of the mirror (hardlinked objects), checked out on its run branch or at the commit it
evaluates. An agent's workspace copy is at `$PILOOP_WORKSPACE`, outside its clone.
"""

from __future__ import annotations

import fcntl
import json
import math
import re
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from piloop_common import gitrepo
from piloop_common.cas import Store, workspace
from piloop_common.protocol.campaign import BundleResponse
from piloop_common.protocol.worker import CampaignJob

# asks the server for what is newer than these commits (the job's lease must be live)
FetchNewer = Callable[[list[str]], BundleResponse]

_SCORE = re.compile(r"^\s*score\s*=\s*(\S+)\s*$")
TAIL_BYTES = 64 * 1024


class Repos:
    def __init__(self, root: Path, store: Store) -> None:
        self.root = root
        self.store = store

    def mirror(self, campaign: str) -> Path:
        return self.root / f"{campaign}.git"

    @contextmanager
    def _locked(self, campaign: str) -> Iterator[Path]:
        # two slots of one worker may start jobs of one campaign at once: one fetch into the mirror at a time
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        with open(self.root / f"{campaign}.lock", "w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            yield self.mirror(campaign)

    def _fetch(self, mirror: Path, address: str, refspec: str) -> int:
        with tempfile.TemporaryDirectory(dir=self.root) as d:
            path = Path(d) / "b.bundle"
            size = self.store.get_file(address, path)
            gitrepo.fetch_bundle(mirror, path, refspec)
        return size

    def checkout(self, spec: CampaignJob, work: Path, fetch_newer: FetchNewer) -> int:
        """Clone the job's commit into `work` (empty); returns the bundle bytes fetched to get it."""
        repo = spec.repo
        moved = 0
        with self._locked(repo.campaign) as mirror:
            if not gitrepo.has_commit(mirror, repo.commit):
                if not (mirror / "HEAD").exists() or not gitrepo.tips(mirror):
                    gitrepo.init_bare(mirror)
                    moved += self._fetch(mirror, repo.bundle, "refs/heads/*:refs/heads/*")
                if not gitrepo.has_commit(mirror, repo.commit):
                    newer = fetch_newer(gitrepo.tips(mirror))
                    if newer.address:
                        moved += self._fetch(mirror, newer.address, "refs/heads/*:refs/heads/*")
                if not gitrepo.has_commit(mirror, repo.commit):
                    raise gitrepo.GitError(f"commit {repo.commit} is not in campaign {repo.campaign}'s repo")
        gitrepo.git("clone", "-q", "--no-checkout", str(mirror), str(work))
        if repo.branch and spec.collect:
            gitrepo.git("checkout", "-q", "-B", repo.branch, repo.commit, cwd=work)
        else:
            gitrepo.git("checkout", "-q", "--detach", repo.commit, cwd=work)
        # commits need an author: the job's own unless the host configures one
        if not gitrepo.git("config", "user.email", cwd=work, check=False).strip():
            gitrepo.git("config", "user.email", "agent@piloop.invalid", cwd=work)
        if not gitrepo.git("config", "user.name", cwd=work, check=False).strip():
            gitrepo.git("config", "user.name", "piloop agent", cwd=work)
        return moved

    def give_workspace(self, spec: CampaignJob, dest: Path) -> None:
        workspace.materialize(workspace.load(spec.workspace, self.store), self.store, dest)

    def collect(self, spec: CampaignJob, work: Path, ws: Path) -> tuple[str, str | None, str | None]:
        """An agent's head, a bundle of its commits since its start (None if none) and its workspace writes."""
        head = gitrepo.git("rev-parse", "--verify", "HEAD^{commit}", cwd=work).strip()
        bundle = None
        if head != spec.repo.commit:
            with tempfile.TemporaryDirectory(dir=work.parent) as d:
                path = Path(d) / "run.bundle"
                if gitrepo.bundle(work, path, ["HEAD", f"^{spec.repo.commit}"]):
                    bundle = self.store.put_file(path)
        writes = workspace.changes(workspace.load(spec.workspace, self.store), ws, self.store) if ws.is_dir() else {}
        return head, bundle, (workspace.save(writes, self.store) if writes else None)


def parse_score(log: Path) -> float | None:
    """The score an evaluation printed: its output's last non-empty line, `score=<number>` or a JSON object
    with a numeric `score`; None when that line is neither."""
    try:
        with open(log, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - TAIL_BYTES))
            lines = [ln for ln in f.read().decode("utf-8", "replace").splitlines() if ln.strip()]
    except OSError:
        return None
    if not lines:
        return None
    last = lines[-1].strip()
    m = _SCORE.match(last)
    value: object = None
    if m:
        value = m.group(1)
    elif last.startswith("{"):
        try:
            value = json.loads(last).get("score")
        except (ValueError, AttributeError):
            return None
    try:
        score = float(value) if isinstance(value, (int, float, str)) and not isinstance(value, bool) else None
    except ValueError:
        return None
    return score if score is not None and math.isfinite(score) else None
