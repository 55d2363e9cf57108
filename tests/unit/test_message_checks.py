"""What every message refuses at the door (protocol.Message, JobSpec): strings Redis could not hold as sent, numbers
that are not finite or past their bounds, env names the loader or piloop reads, input names leaving inputs/."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from piloop_common.errors import BadRequest
from piloop_common.protocol.report import ReportRequest, ReportsRequest
from piloop_common.protocol.schedule import check_cron
from piloop_common.protocol.worker import JobSpec, input_problem, text_problem

ADDR = "sha256:" + "ab" * 32


@pytest.mark.parametrize(
    ("data", "says"),
    [
        ("a\ud800", "lone surrogate"),
        ("a\x00b", "NUL"),
        ({"k\ud800": "v"}, "lone surrogate"),
        ({"argv": ["ok", "x\x00"]}, "argv[1]: a NUL"),
        ({"env": {"A": ["\udfff"]}}, "env.A[0]"),
        ({"k\x00": 1}, "a key"),
        ({"n": 1, "argv": ["\\u0000", "\x00"]}, "argv[1]: a NUL"),  # the text \u0000 beside a real NUL
    ],
)
def test_text_problem_names_where(data, says):
    assert says in text_problem(data)


def test_clean_text_passes():
    assert text_problem({"argv": ["é", "日本", "🙂"], "n": 1.5, "none": None}) == ""
    # what JSON writes as a NUL's escape, as text, is no NUL; nor are types JSON lacks, walked instead
    assert text_problem({"argv": ["\\u0000", "a\\\\u0000"], "raw": b"x"}) == ""


def test_a_nested_message_is_checked_by_its_outer_one_and_alone():
    report = {"protocol": 2, "report_id": "r1", "job": "j1", "token": "1.ab", "outcome": "succeeded"}
    batch = {"protocol": 2, "reports": [report, {**report, "usage": {"peak_rss_bytes": 1}, "reason": "a\x00"}]}
    with pytest.raises(ValidationError, match=r"reports\[1\]\.reason: a NUL character is refused"):
        ReportsRequest.model_validate(batch)
    with pytest.raises(ValidationError, match="reason: a NUL character is refused"):
        ReportRequest.model_validate(batch["reports"][1])
    # the flag an outer message sets while its nested ones validate is gone after it, refused or not
    with pytest.raises(ValidationError, match="lone surrogate"):
        ReportRequest.model_validate({**report, "reason": "\udfff"})
    assert ReportsRequest.model_validate({**batch, "reports": [report]}).reports[0].job == "j1"


@pytest.mark.parametrize(
    "spec",
    [
        {"argv": ["a\ud800"]},
        {"argv": ["a"], "memory_mb": 10**18},
        {"argv": ["a"], "expires_seconds": 1e308},
        {"argv": ["a"], "timeout_seconds": float("inf")},
        {"argv": ["a"], "timeout_seconds": float("nan")},
        {"argv": ["a"], "env": {"A=B": "1"}},
        {"argv": ["a"], "env": {"ld_preload": "/x.so"}},
        {"argv": ["a"], "env": {"PILOOP_RELAY": "x"}},
        {"argv": ["a"], "inputs": {"../../x": ADDR}},
        {"argv": ["a"], "inputs": {"/etc/passwd": ADDR}},
    ],
)
def test_a_spec_past_the_rules_is_refused(spec):
    with pytest.raises(ValidationError):
        JobSpec.model_validate(spec)


def test_a_spec_within_the_rules_is_taken():
    got = JobSpec.model_validate(
        {"argv": ["a"], "env": {"PATH": "/bin", "_X1": "y"}, "inputs": {"data/a.txt": ADDR}, "memory_mb": 4096}
    )
    assert got.env == {"PATH": "/bin", "_X1": "y"} and list(got.inputs) == ["data/a.txt"]


@pytest.mark.parametrize("name", ["", ".", "a/../b", "a//b", "a\\b", "x" * 256])
def test_input_names_that_leave_inputs(name):
    assert input_problem(name)


@pytest.mark.parametrize("cron", ["0 0 30 2 *", "* * * * * * *", "* * *", "61 * * * *"])
def test_a_cron_with_no_next_date_or_the_wrong_fields_is_refused(cron):
    with pytest.raises(BadRequest, match="not a cron"):
        check_cron(cron)


def test_inline_inputs_are_base64_within_the_inline_cap_and_apart_from_the_cas_inputs():
    import base64

    from piloop_common.bytecaps import INLINE_MAX_BYTES, inline

    def b64(n: int) -> str:
        return base64.b64encode(b"x" * n).decode()

    ok = JobSpec.model_validate({"argv": ["m:f"], "inline_inputs": {"args.json": b64(INLINE_MAX_BYTES)}})
    assert base64.b64decode(ok.inline_inputs["args.json"]) == b"x" * INLINE_MAX_BYTES
    assert inline(b"x" * INLINE_MAX_BYTES) is not None and inline(b"x" * (INLINE_MAX_BYTES + 1)) is None
    for bad, says in (
        ({"args.json": b64(INLINE_MAX_BYTES // 2), "more": b64(INLINE_MAX_BYTES // 2 + 1)}, "over 65536"),
        ({"args.json": "not base64!"}, "not base64"),
        ({"../args.json": b64(1)}, "inline input name"),
    ):
        with pytest.raises(ValidationError, match=says):
            JobSpec.model_validate({"argv": ["m:f"], "inline_inputs": bad})
    with pytest.raises(ValidationError, match="both inline and a CAS address"):
        JobSpec.model_validate({"argv": ["m:f"], "inputs": {"args.json": ADDR}, "inline_inputs": {"args.json": b64(1)}})
