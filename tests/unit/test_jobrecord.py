"""`job.json` as one typed record: written and read back whole, and a bad or partial file a clear error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from piloop_common.protocol.worker import Assignment, CampaignJob, JobSpec, RepoSpec
from piloop_worker.cgroups import Cgroups
from piloop_worker.jobdir import JobDir
from piloop_worker.jobrecord import BadJobRecord, JobRecord
from piloop_worker.reattach import find_held
from tests.helpers.jobrecords import job_record

CAMPAIGN = CampaignJob(repo=RepoSpec(campaign="c1", bundle="sha256:" + "0" * 64, commit="a" * 40), collect=True)
ASSIGNMENT = Assignment(
    job="j1",
    token="5.ab",
    kind="agent",
    pool="gpu",
    campaign="c1",
    image="img:1",
    spec=JobSpec(argv=["python", "-m", "train"], env={"A": "1"}, campaign=CAMPAIGN),
    secrets={"hf": "s3cret", "aws": "k"},
    memory_mb=2048,
)


def test_the_file_holds_the_assignment_less_its_secret_values(tmp_path: Path) -> None:
    rec = JobRecord.from_assignment(ASSIGNMENT, tmp_path / "relay.sock", 1700000000.5)
    jd = JobDir.for_lease(tmp_path, "j1", "5.ab")
    jd.create(rec)
    stored = json.loads(jd.job_json.read_text())
    assert stored == {
        **ASSIGNMENT.model_dump(mode="json", exclude={"secrets"}),
        "secret_names": ["aws", "hf"],
        "claimed_at": 1700000000.5,
        "relay": str(tmp_path / "relay.sock"),
    }
    assert "s3cret" not in jd.job_json.read_text()
    assert jd.record() == rec and JobRecord.from_dict(rec.to_dict()) == rec
    assert rec.spec.campaign == CAMPAIGN and rec.memory_mb == 2048


def test_a_missing_file_is_none(tmp_path: Path) -> None:
    assert JobDir.for_lease(tmp_path, "j1", "1").record() is None


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('{"job": "j1", "tok', "not JSON, or cut short"),
        ("[1, 2]", "not a job record (a JSON object), but list"),
        ('{"job": "j1", "kind": "agent", "pool": "p", "spec": {"argv": ["x"]}}', "token: Field required"),
        ('{"job": "j1", "token": "1", "kind": "fast", "pool": "p", "spec": {"argv": ["x"]}}', "kind: Input should be"),
    ],
)
def test_a_bad_file_is_a_clear_error(tmp_path: Path, text: str, says: str) -> None:
    jd = JobDir.for_lease(tmp_path, "j1", "1")
    jd.create(job_record("j1", "1"))
    jd.job_json.write_text(text)
    with pytest.raises(BadJobRecord) as e:
        jd.record()
    assert str(jd.job_json) in str(e.value) and says in str(e.value)


def test_a_field_another_version_wrote_is_ignored() -> None:
    data = {**job_record("j1", "1").to_dict(), "added_later": 1}
    assert JobRecord.from_dict(data) == job_record("j1", "1")


def test_reattach_drops_a_dir_whose_record_was_cut_short(tmp_path: Path) -> None:
    good, cut = JobDir.for_lease(tmp_path, "j1", "1"), JobDir.for_lease(tmp_path, "j2", "1")
    good.create(job_record("j1", "1"))
    cut.create(job_record("j2", "1"))
    cut.job_json.write_text(cut.job_json.read_text()[:20])
    held = find_held(tmp_path, Cgroups("test", root=tmp_path / "no-cgroups"))
    assert [(h.lease.job, h.lease.token, h.record) for h in held] == [("j1", "1", job_record("j1", "1"))]
    assert good.root.exists() and not cut.root.exists()
