"""Addresses: exactly `sha256:<64 lowercase hex>`, nothing a path could be built from."""

from __future__ import annotations

import hashlib
import io

import pytest

from piloop_common.cas.address import hash_bytes, hash_stream, hex_of, parse_address
from piloop_common.errors import BadAddress

GOOD = "sha256:" + hashlib.sha256(b"x").hexdigest()


def test_a_good_address_parses_to_itself() -> None:
    assert parse_address(GOOD) == GOOD
    assert hex_of(GOOD) == GOOD.removeprefix("sha256:")


@pytest.mark.parametrize(
    "bad",
    [
        "sha256:../" + "a" * 61,
        "sha256:" + "a" * 62 + "/.",
        GOOD.upper(),
        "SHA256:" + GOOD[7:],
        GOOD[:-1],
        GOOD + "0",
        GOOD + "\n",
        " " + GOOD,
        "sha1:" + "a" * 40,
        "blake3:" + "a" * 64,
        GOOD[7:],
        "",
        None,
        b"sha256:" + b"a" * 64,
    ],
)
def test_anything_else_is_refused(bad: object) -> None:
    with pytest.raises(BadAddress, match="not a CAS address"):
        parse_address(bad)


def test_hashing_bytes_and_streams_agree() -> None:
    data = b"piloop" * 500_000  # several chunks
    assert hash_bytes(data) == hash_stream(io.BytesIO(data)) == "sha256:" + hashlib.sha256(data).hexdigest()
    assert hash_bytes(b"") == "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
