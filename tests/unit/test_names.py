"""The one name rule (piloop_common/names.py) for tokens and workers."""

from __future__ import annotations

import pytest

from piloop_common.errors import BadRequest
from piloop_common.names import check_name, problem

ATTACKS = [
    "serve",
    "piloop",
    "piloop-x",
    "victim:leases:evaluation",
    "../../etc",
    "*",
    "{evil}",
    "a" * 300,
    "Gpu1",
    "",
    "-lead",
    ".hidden",
    "a b",
    "a\n",
    "tab\t",
    "é",
    "a" * 64,
]
GOOD = ["gpu1", "a", "0", "gpu-1.box_2", "a" * 63, "serves", "my-piloop", "9lives"]


@pytest.mark.parametrize("name", ATTACKS)
def test_a_bad_name_is_refused_naming_what_was_given_and_what_is_allowed(name):
    with pytest.raises(BadRequest) as e:
        check_name("token", name)
    msg = e.value.message
    assert msg.startswith("token name ") and "\n" not in msg
    assert (repr(name) if len(name) <= 70 else repr(name[:60])) in msg
    assert ("reserved" in msg) == (name in ("serve", "piloop", "piloop-x"))
    assert "a-z, 0-9" in msg or "reserved" in msg


@pytest.mark.parametrize("name", GOOD)
def test_a_good_name_passes_as_it_is(name):
    assert check_name("worker", name) == name and problem(name) == ""


def test_a_long_name_is_shown_cut_with_its_length():
    with pytest.raises(BadRequest, match=r"\(300 characters\)") as e:
        check_name("worker", "x" * 300)
    assert len(e.value.message) < 250


@pytest.mark.parametrize("name", ["serve", "piloop-local"])
def test_the_reserved_names_are_the_daemons_own(name):
    assert check_name("worker", name, reserved_ok=True) == name
    with pytest.raises(BadRequest, match="reserved"):
        check_name("worker", name)


def test_reserved_ok_still_refuses_a_name_that_is_no_name():
    with pytest.raises(BadRequest, match="a-z, 0-9"):
        check_name("worker", "victim:leases:evaluation", reserved_ok=True)
