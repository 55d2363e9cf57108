"""Memory grants' arithmetic, no processes: sizes, the worker's room, the held-at-limit watch, the flags."""

from __future__ import annotations

import click
import pytest

from piloop_common.cli.submit import _policy
from piloop_common.errors import BadRequest
from piloop_common.protocol.worker import JobSpec
from piloop_common.sizes import format_memory, parse_memory
from piloop_worker.cgroups import HeldWatch
from piloop_worker.records import ExitRecord, StopReason
from piloop_worker.room import Room


@pytest.mark.parametrize(
    "text,mb",
    [
        ("4G", 4096),
        ("512M", 512),
        ("1.5GiB", 1536),
        ("4096", 4096),
        ("2gb", 2048),
        ("1T", 1024 * 1024),
        ("1.1M", 2),
        (300, 300),
    ],
)
def test_sizes_are_binary_and_round_up_to_mib(text, mb):
    assert parse_memory(text) == mb


@pytest.mark.parametrize("text", ["4X", "", "0", "-1G", "G", "4 G B", "1e3"])
def test_a_bad_size_names_the_flag(text):
    with pytest.raises(BadRequest, match=r"^--memory-max "):
        parse_memory(text, "--memory-max")


def test_format_memory():
    assert (format_memory(None), format_memory(512), format_memory(2048)) == ("-", "512 MiB", "2.0 GiB")


def test_room_is_measured_idle_and_kept_while_jobs_use_their_grants():
    r = Room()
    assert r.measure(available=10_000, granted=0, reserve=512, idle=True) == 9488
    # two 4 GiB jobs using all of it: available falls by what they use, the room stays
    assert r.measure(available=10_000 - 8192, granted=8192, reserve=512, idle=False) == 9488
    # using little of their grants: still no more room than was there (no overcommit)
    assert r.measure(available=9_900, granted=8192, reserve=512, idle=False) == 9488
    # another process on the host took 3 GiB meanwhile: the room shrinks at once
    assert r.measure(available=10_000 - 8192 - 3072, granted=8192, reserve=512, idle=False) == 9488 - 3072
    assert r.measure(available=100, granted=0, reserve=512, idle=True) == 0


def test_room_of_a_worker_that_starts_with_jobs_is_what_is_available_now():
    r = Room()
    assert r.measure(available=3000, granted=2048, reserve=0, idle=False) == 3000


def test_held_counts_only_refaulting_at_the_limit_and_forgives_short_gaps():
    mb = 2**20
    w = HeldWatch(100 * mb, seconds=2.0)
    assert not w.observe(0.0, 99 * mb, 10)  # first sample: no rate yet
    assert not w.observe(0.5, 99 * mb, 20) and w.since == 0.5
    assert not w.observe(1.0, 99 * mb, 20)  # a sample without refaults inside the slack keeps the hold
    assert not w.observe(2.0, 95 * mb, 30)
    assert w.observe(2.5, 95 * mb, 40)
    # streaming through more than the limit (at it, but nothing read back) is never held
    s = HeldWatch(100 * mb, seconds=1.0)
    assert not any(s.observe(t / 2, 99 * mb, 5) for t in range(20))
    # refaulting far under the limit is not held either (its own churn, not the limit)
    u = HeldWatch(100 * mb, seconds=1.0)
    assert not any(u.observe(t / 2, 50 * mb, t) for t in range(20))


def test_a_hold_ends_after_the_slack_without_refaults():
    mb = 2**20
    w = HeldWatch(100 * mb, seconds=3.0)
    w.observe(0.0, 99 * mb, 0)
    w.observe(0.5, 99 * mb, 1)
    w.observe(1.0, 99 * mb, 2)
    assert w.since == 0.5
    w.observe(3.0, 99 * mb, 2)  # 2 s without refaults > SLACK
    assert w.since is None


def test_outcomes_of_memory_ends():
    assert ExitRecord(signal=9, oom=True).outcome() == ("failed", "out of memory")
    why = "out of memory (held at its limit for 2s)"
    held = ExitRecord(signal=15, oom=True, stopped=StopReason.MEMORY_HELD, reason=why)
    assert held.outcome() == ("failed", why)


def test_flags_make_the_spec_fields_and_refuse_bad_ones():
    got = _policy("1.5G", None, 2.0, "6G", 3, "30s")
    assert got == {
        "memory_mb": 1536,
        "memory_max_mb": 6144,
        "memory_growth": 2.0,
        "max_attempts": 3,
        "backoff_seconds": 30.0,
    }
    JobSpec(argv=["x"], **got)
    assert _policy(None, None, None, None, None, None) == {"memory_mb": None}
    for args, flag in [
        (("4X", None, None, None, None, None), "--memory"),
        (("4G", None, None, "1G", None, None), "--memory-max"),
        (("4G", 100, None, None, None, None), "--memory-mb"),
        ((None, None, 0.5, None, None, None), "--memory-growth"),
        ((None, None, None, None, 0, None), "--max-attempts"),
        ((None, None, None, None, None, "soon"), "--backoff"),
    ]:
        with pytest.raises((click.UsageError, BadRequest), match=flag):
            _policy(*args)
