"""Each Lua script's header declares its KEYS and ARGV counts (`-- @call`), and `Scripts` refuses a call that does
not match before Redis sees it."""

from __future__ import annotations

from importlib import resources

import pytest
import redis

from piloop_server.state.scripts import Count, Fence, Scripts, counts

NAMES = sorted(
    p.name.removesuffix(".lua")
    for p in resources.files("piloop_server.state").joinpath("scripts").iterdir()
    if p.name.endswith(".lua")
)


def _unreachable() -> Scripts:
    """Scripts on a client whose Redis is not there: a call the counts let through fails reaching it."""
    return Scripts(redis.Redis(unix_socket_path="/nonexistent/piloop-test.sock", socket_connect_timeout=0.1))


@pytest.mark.parametrize("name", NAMES)
def test_every_script_declares_its_counts(name: str) -> None:
    nkeys, nargs = counts(name)
    assert nkeys.base >= 1 and nargs.base >= 1


def test_counts_with_items() -> None:
    assert counts("append_log") == (Count(4), Count(8, 2))
    assert counts("claim") == (Count(14), Count(11, 1))
    assert [Count(8, 2).allows(n) for n in (7, 8, 9, 10, 12)] == [False, True, False, True, True]
    assert [Count(3).allows(n) for n in (2, 3, 4)] == [False, True, False]


def test_a_wrong_key_count_is_refused_before_redis() -> None:
    with pytest.raises(ValueError, match=r"drain\.lua takes 2 KEYS and 3 ARGV .* gave 1 KEYS and 3 ARGV"):
        _unreachable().run("drain", ["k1"], ["gpu1", "human:test", "idle"])


def test_a_wrong_arg_count_is_refused_before_redis() -> None:
    with pytest.raises(ValueError, match=r"append_log\.lua takes 4 KEYS and 8\+2n ARGV .* gave 4 KEYS and 9 ARGV"):
        _unreachable().run("append_log", ["a", "b", "c", "d"], list(range(9)))


def test_a_wrong_count_in_a_batch_is_refused_before_redis() -> None:
    good = (["k1", "k2"], ["gpu1", "human:test", "idle"])
    with pytest.raises(ValueError, match=r"drain\.lua takes 2 KEYS and 3 ARGV"):
        _unreachable().run_many("drain", [good, (["k1", "k2"], ["gpu1"])])


def test_a_right_count_reaches_redis() -> None:
    """The counts are the caller's: the fence's key and token, and the event cap, are added after the check."""
    with pytest.raises(redis.exceptions.ConnectionError):  # loading the script: it got past the check
        _unreachable().run("drain", ["k1", "k2"], ["gpu1", "human:test", "idle"])
    with pytest.raises(redis.exceptions.ConnectionError):
        _unreachable().run("due", ["k1", "k2"], ["prefix", 100], Fence("leader", "7"))
