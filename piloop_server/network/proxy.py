"""The proxy network: a proxy in front of the server authenticates every caller and stamps its claims in headers.

`[plugins.network] claims` names the headers, `rules` gives access by their values (the first rule that
matches wins; none matching is refused), and `name_claims` names a caller that is not a worker. A worker names
itself in `x-piloop-worker`. piloop's own tokens (`plt_`) are refused here: the proxy is the one authentication.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from dataclasses import dataclass

from piloop_common.config.network import NetworkConfig, ProxyRule
from piloop_common.errors import Forbidden, Refused

WORKER_HEADER = "x-piloop-worker"
TOKEN_PREFIX = "plt_"
# a worker's name becomes part of Redis keys and of its work dir: keep it plain
WORKER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


@dataclass(frozen=True)
class ProxyIdentity:
    kind: str  # worker | human | service
    name: str
    rule: int  # the index of the rule that matched, for logs and errors
    role: str = ""  # an `act` rule's role (auth.Role); none for a worker


def read_claims(headers: Mapping[str, str], net: NetworkConfig) -> dict[str, str]:
    """Each claim's value from the header the proxy stamps it in ('' when absent)."""
    return {claim: (headers.get(header.lower()) or "").strip() for claim, header in net.claims.items()}


def match_rule(rules: list[ProxyRule], claims: Mapping[str, str]) -> int | None:
    """The index of the first rule whose every `when` claim has exactly its value, or None."""
    for i, rule in enumerate(rules):
        if all(claims.get(claim, "") == value for claim, value in rule.when.items()):
            return i
    return None


def _shown(claims: Mapping[str, str]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in sorted(claims.items()) if v) or "none"


def carries_token(authorization: str) -> bool:
    """Whether an `Authorization` value holds a piloop token, whatever its scheme and spacing (`Bearer<TAB>plt_…`,
    `token plt_…`, `plt_…` alone) or inside a base64 word (`Basic` of `user:plt_…`)."""
    if TOKEN_PREFIX in authorization:
        return True
    for word in authorization.split():
        try:
            decoded = base64.b64decode(
                word + "=" * (-len(word) % 4), altchars=b"-_" if "-" in word or "_" in word else None
            )
        except (binascii.Error, ValueError):
            continue
        if TOKEN_PREFIX.encode() in decoded:
            return True
    return False


def identify_proxy(headers: Mapping[str, str], net: NetworkConfig) -> ProxyIdentity:
    """Who a TCP caller is on the proxy network, or Refused/Forbidden saying why it is refused."""
    if carries_token(headers.get("authorization") or ""):
        raise Refused(
            "piloop tokens (plt_) are refused on the proxy network: the proxy in front of the "
            "server is the one authentication"
        )
    claims = read_claims(headers, net)
    i = match_rule(net.rules, claims)
    if i is None:
        raise Forbidden(f"no rule of [plugins.network] rules matches this caller (claims: {_shown(claims)})")
    rule = net.rules[i]
    if rule.access == "worker":
        name = (headers.get(WORKER_HEADER) or "").strip()
        if not name:
            raise Forbidden(
                f"rule {i + 1} is for workers, and a worker names itself in {WORKER_HEADER} (`piloop worker --name`)"
            )
        if not WORKER_NAME.match(name):
            raise Forbidden(f"{WORKER_HEADER}: {name[:80]!r} is not a worker name (letters, digits, . _ -; at most 64)")
        return ProxyIdentity("worker", name, i)
    name = next((claims[c] for c in net.name_claims if claims.get(c)), "")
    if not name:
        raise Forbidden(
            f"rule {i + 1} matched, but none of name_claims ({', '.join(net.name_claims) or 'none set'}) "
            "has a value to name this caller"
        )
    return ProxyIdentity(rule.caller, name, i, rule.role)
