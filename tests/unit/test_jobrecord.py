"""A job's record as one typed record: sent to its slot's supervisor and read back whole, a bad one a clear error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from piloop_common.protocol.worker import Assignment, CampaignJob, JobSpec, RepoSpec
from piloop_worker.jobrecord import BadJobRecord, JobRecord
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


def test_the_record_holds_the_assignment_less_its_secret_values(tmp_path: Path) -> None:
    rec = JobRecord.from_assignment(ASSIGNMENT, tmp_path / "relay.sock", 1700000000.5)
    stored = json.loads(json.dumps(rec.to_start()))  # as it crosses the slot's socket and comes back
    assert stored == {
        **ASSIGNMENT.model_dump(mode="json", exclude={"secrets"}),
        "secret_names": ["aws", "hf"],
        "claimed_at": 1700000000.5,
        "relay": str(tmp_path / "relay.sock"),
        "fetched_bytes": 0,
    }
    assert "s3cret" not in json.dumps(stored)
    assert JobRecord.from_dict(stored) == rec and JobRecord.from_dict(rec.to_dict()) == rec
    assert rec.spec.campaign == CAMPAIGN and rec.memory_mb == 2048


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('{"job": "j1", "tok', "not JSON, or cut short"),
        ("[1, 2]", "not a job record (a JSON object), but list"),
        ('{"job": "j1", "kind": "agent", "pool": "p", "spec": {"argv": ["x"]}}', "token: Field required"),
        ('{"job": "j1", "token": "1", "kind": "fast", "pool": "p", "spec": {"argv": ["x"]}}', "kind: Input should be"),
    ],
)
def test_a_bad_record_is_a_clear_error(text: str, says: str) -> None:
    with pytest.raises(BadJobRecord) as e:
        JobRecord.from_json(text, "slot 0's record")
    assert "slot 0's record" in str(e.value) and says in str(e.value)


def test_a_field_another_version_wrote_is_ignored() -> None:
    data = {**job_record("j1", "1").to_dict(), "added_later": 1}
    assert JobRecord.from_dict(data) == job_record("j1", "1")
