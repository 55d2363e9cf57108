"""A campaign's git repo on the server: `$PILOOP_HOME/campaigns/<name>/repo.git`, the commits agents may name,
and the bundles a worker fetches of what is newer than what it has (cached in the CAS by what they leave out)."""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

from piloop_common import gitrepo
from piloop_common.errors import NotFound
from piloop_common.protocol.campaign import BundleResponse
from piloop_server.runtime import Runtime

BUNDLE_CACHE_SECONDS = 3600


def repo_dir(rt: Runtime, name: str) -> Path:
    return rt.home / "campaigns" / name / "repo.git"


def repo_commit(rt: Runtime, name: str, commit: str) -> str:
    """The full sha of `commit` (a sha or a prefix of one) in the campaign's repo on the server; else NotFound."""
    repo = repo_dir(rt, name)
    full = (
        gitrepo.git(
            "rev-parse", "--verify", "--quiet", "--end-of-options", f"{commit}^{{commit}}", cwd=repo, check=False
        ).strip()
        if repo.is_dir()
        else ""
    )
    if not gitrepo.SHA.match(full) or not full.startswith(commit):
        raise NotFound(
            f"commit {commit}: not a commit of campaign {name}'s repo (its base, its branches and the "
            "runs taken in; an agent's own commits reach it when its run ends)"
        )
    return full


def newer_bundle(rt: Runtime, name: str, have: list[str]) -> BundleResponse:
    """A bundle of the campaign's branches leaving out what `have` reaches (cached in the CAS by what it
    leaves out), or nothing when nothing is newer."""
    repo = repo_dir(rt, name)
    known = sorted({h for h in have if gitrepo.SHA.match(h) and gitrepo.has_commit(repo, h)})
    tips = gitrepo.tips(repo)
    have_key = hashlib.sha256(" ".join([*known, "|", *tips]).encode()).hexdigest()[:32]
    cached = rt.campaigns.cached_bundle(name, have_key)
    if cached:
        addr, _, cached_size = cached.partition(" ")
        if addr == "-":
            return BundleResponse()
        if rt.store.has(addr):
            return BundleResponse(address=addr, size=int(cached_size))
    with tempfile.TemporaryDirectory(dir=repo.parent) as d:
        path = Path(d) / "newer.bundle"
        if not gitrepo.bundle(repo, path, ["--branches", *(f"^{h}" for h in known)]):
            rt.campaigns.cache_bundle(name, have_key, "- 0", BUNDLE_CACHE_SECONDS)
            return BundleResponse()
        size = path.stat().st_size
        addr = rt.store.put_file(path)
    rt.campaigns.cache_bundle(name, have_key, f"{addr} {size}", BUNDLE_CACHE_SECONDS)
    return BundleResponse(address=addr, size=size)
