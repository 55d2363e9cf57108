"""Campaign parts without a server: the score line, the workspace manifest, bundles in and out of a mirror."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from piloop_common import gitrepo
from piloop_common.cas import workspace
from piloop_common.cas.local import LocalStore
from piloop_worker.repos import parse_score

ENV = {
    **os.environ,
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@t",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@t",
}


@pytest.mark.parametrize(
    "text,score",
    [
        ("working\nscore=0.75\n", 0.75),
        ("score = 12\n\n\n", 12.0),
        ('noise\n{"score": 3, "loss": 1}\n', 3.0),
        ("score=-1e3", -1000.0),
        ("score=0.9\nthen something else\n", None),  # the last line only
        ("score=nan\n", None),
        ("score=inf\n", None),
        ('{"score": "high"}\n', None),
        ('{"score": true}\n', None),
        ('{"loss": 1}\n', None),
        ("", None),
        ("score=\n", None),
    ],
)
def test_the_score_is_the_last_line(tmp_path, text, score):
    p = tmp_path / "output.log"
    p.write_text(text)
    assert parse_score(p) == score


def test_a_missing_log_has_no_score(tmp_path):
    assert parse_score(tmp_path / "none.log") is None


def test_workspace_changes_and_merge(tmp_path):
    store = LocalStore(tmp_path / "cas")
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "keep.txt").write_text("same")
    (src / "edit.txt").write_text("old")
    (src / "d" / "gone.txt").write_text("bye")
    manifest = workspace.snapshot(src, store)
    assert sorted(manifest) == ["d/gone.txt", "edit.txt", "keep.txt"]
    copy = tmp_path / "copy"
    workspace.materialize(manifest, store, copy)
    (copy / "edit.txt").write_text("new")
    (copy / "d" / "gone.txt").unlink()
    (copy / "d" / "new.txt").write_text("hello")
    writes = workspace.changes(manifest, copy, store)
    assert set(writes) == {"edit.txt", "d/gone.txt", "d/new.txt"}  # the unchanged file is not sent
    assert writes["d/gone.txt"] is None
    merged = workspace.merge(manifest, writes)
    assert sorted(merged) == ["d/new.txt", "edit.txt", "keep.txt"]
    assert store.get_bytes(merged["edit.txt"]) == b"new"
    # a manifest round trip through the CAS; paths that escape are refused
    assert workspace.load(workspace.save(merged, store), store) == merged
    assert workspace.merge({}, {"../x": "sha256:" + "0" * 64, "/abs": None}) == {}
    with pytest.raises(ValueError):
        workspace.load(store.put_bytes(b'{"../escape": "x"}'), store)


def _commit(repo: Path, name: str, data: bytes) -> str:
    (repo / name).write_bytes(data)
    subprocess.run(["git", "add", name], cwd=repo, check=True, env=ENV)
    subprocess.run(["git", "commit", "-qm", name], cwd=repo, check=True, env=ENV)
    return subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=repo, check=True, env=ENV, capture_output=True, text=True
    ).stdout.strip()


def test_an_incremental_bundle_carries_only_what_is_newer(tmp_path):
    src = tmp_path / "src"
    subprocess.run(["git", "init", "-q", "-b", "main", str(src)], check=True, env=ENV)
    first = _commit(src, "big.bin", os.urandom(100_000))
    full = tmp_path / "full.bundle"
    assert gitrepo.bundle(src, full, ["--branches"])
    mirror = tmp_path / "mirror.git"
    gitrepo.init_bare(mirror)
    gitrepo.fetch_bundle(mirror, full)
    assert gitrepo.has_commit(mirror, first) and gitrepo.tips(mirror) == [first]
    # nothing newer: no bundle at all
    assert not gitrepo.bundle(src, tmp_path / "none.bundle", ["--branches", f"^{first}"])
    second = _commit(src, "small.txt", b"a small change")
    newer = tmp_path / "newer.bundle"
    assert gitrepo.bundle(src, newer, ["--branches", *(f"^{h}" for h in gitrepo.tips(mirror))])
    assert newer.stat().st_size < full.stat().st_size / 20
    gitrepo.fetch_bundle(mirror, newer)
    assert gitrepo.has_commit(mirror, second)
    with pytest.raises(gitrepo.GitError, match="git rev-parse"):
        gitrepo.git("rev-parse", "--verify", "nope^{commit}", cwd=mirror)
